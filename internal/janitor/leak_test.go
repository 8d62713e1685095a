package janitor

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// settledGoroutines waits (bounded) for goroutines ending after a
// closed connection to be gone, and returns how many are left.
func settledGoroutines(limit int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchRoundsCloseEngineClients: 60 of watch's rounds against a real
// containerd, each followed by doctor's version question and an event
// subscription that ends, to engines built and dropped, leave this process's open
// files and goroutines where the first round left them: every engine
// client a round opens is closed by that round, and so is every socket
// directory its sweep held open for cull.
func TestWatchRoundsCloseEngineClients(t *testing.T) {
	addr := containerdtest.Address(t)
	w := &Watch{
		Settings: Settings{
			Engines:  []string{"containerd"},
			Engine:   engine.Config{ContainerdAddress: addr, Timeout: 10 * time.Second},
			StateDir: t.TempDir(),
			// A comm nothing runs: the rounds ask, find no tree, touch nothing.
			Reconcile: reconcile.Options{Comms: []string{"kc-leak-none"}},
			Sockets:   sweep.Config{Dirs: []string{t.TempDir()}},
		},
		// Cull too: its audit dials through the sweep's directories,
		// which the round holds open until then (sweep.Socket.Pin).
		ReconcileOn: true,
		CullOn:      true,
	}
	log, buf := jsonLogger()
	ctx := context.Background()
	round := func() {
		if code := w.Once(ctx, log); code != ExitOK {
			t.Fatalf("round exited %d:\n%s", code, buf.b.String())
		}
		es, err := w.Select(log)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.VersionOf(ctx, es[0]); err != nil {
			t.Fatal(err)
		}
		// A subscription that ends, as watch's does on a drop or a stop.
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := es[0].Deaths(sctx, engine.DeathWatch{Ready: cancel, Death: func(engine.Death) {}}); err != nil || sctx.Err() != context.Canceled {
			t.Fatalf("subscription: %v (%v)", err, sctx.Err())
		}
	}
	round() // grpc's and the runtime's own one-time goroutines and files
	// No collection meanwhile: an *os.File dropped open is closed by its
	// finaliser, which would hide the leak.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	fds0, gr0 := openFDs(t), runtime.NumGoroutine()
	for range 60 {
		round()
	}
	fds, gr := openFDs(t), settledGoroutines(gr0)
	t.Logf("after 1 round: %d fds, %d goroutines; after 61: %d fds, %d goroutines", fds0, gr0, fds, gr)
	// A small slack for the runtime's own (a timer, a finaliser) but far
	// below one per round.
	if fds > fds0+3 || gr > gr0+5 {
		t.Errorf("60 rounds grew open files %d → %d and goroutines %d → %d: an engine client or a socket directory is left open", fds0, fds, gr0, gr)
	}
}
