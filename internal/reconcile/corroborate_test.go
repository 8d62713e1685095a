package reconcile

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/liveness"
	"github.com/kc-watchman/kc-watchman/internal/testkit"
	"github.com/kc-watchman/kc-watchman/internal/testkit/proc"
)

// startMonitor starts a real process whose comm is conmon and whose argv
// carries cid, as podman's conmon does (-c <id>).
func startMonitor(t *testing.T, cid string) int {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "conmon")
	data, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The shell forks the sleep: start it in a group of its own so that
	// cleanup kills both, not the shell alone.
	cmd := exec.Command(bin, "-c", "sleep 1000; :", "conmon", "-c", cid)
	proc.StartGroup(t, cmd)
	proc.WaitFor(t, 10*time.Second, "the monitor to run", func() bool {
		id, err := fingerprint.Read("/proc", cmd.Process.Pid)
		return err == nil && id.Comm == "conmon" && len(id.Argv) > 4
	})
	return cmd.Process.Pid
}

// TestCorroboration: an engine answer that omits a container whose conmon
// (or ledger-recorded init) is alive is contradicted. One contradiction
// spares that tree; two make the whole run unknown, with nothing touched.
func TestCorroboration(t *testing.T) {
	const comm = "kcsrv-corrob"
	const (
		cidMon  = "6666666666666666666666666666666666666666666666666666666666666666"
		cidInit = "7777777777777777777777777777777777777777777777777777777777777777"
		cidGone = "8888888888888888888888888888888888888888888888888888888888888888"
	)
	empty := liveness.Set{Source: liveness.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	// MinAge 0: no age rule. Ages count in clock ticks, so a tree scanned in
	// its first tick is 0 old and any positive minimum would call it young.
	base := Options{Comms: []string{comm}, KillGrace: 200 * time.Millisecond, Apply: true}

	t.Run("a live conmon spares its tree; others are reaped", func(t *testing.T) {
		kept := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidMon})
		gone := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidGone})
		startMonitor(t, cidMon)
		opt := base
		opt.Containers = map[string]bool{cidMon: true, cidGone: true}
		rep, err := Run(context.Background(), opt, empty)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, kept.PGID); tr == nil || tr.Action != action.SkipContradicted {
			t.Fatalf("tree of a container whose conmon runs: %+v", tr)
		}
		if tr := findByPGID(rep, gone.PGID); tr == nil || tr.Action != action.Reaped {
			t.Fatalf("stray tree: %+v", tr)
		}
		if !running(kept.PID) {
			t.Fatal("the contradicted tree was signalled")
		}
	})

	t.Run("two contradictions: wrong store, nothing touched", func(t *testing.T) {
		a := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidMon})
		b := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidInit})
		c := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidGone})
		startMonitor(t, cidMon)
		store, err := ledger.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		// The init the hook recorded for cidInit: a live process of
		// this boot, no poststop.
		initCmd := exec.Command("sleep", "1000")
		proc.Start(t, initCmd)
		st := startOf(t, initCmd.Process.Pid)
		if err := store.Update(cidInit, func(r *ledger.Record) error {
			r.Init = &ledger.Process{PID: initCmd.Process.Pid, StartTicks: st}
			r.Stages = map[string]time.Time{"createRuntime": time.Now()}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		opt := base
		opt.Store = store
		opt.Containers = map[string]bool{cidMon: true, cidInit: true, cidGone: true}
		rep, err := Run(context.Background(), opt, empty)
		if !errors.Is(err, ErrWrongStore) || !errors.Is(err, liveness.ErrUnknown) {
			t.Fatalf("err = %v, want the wrong-store error", err)
		}
		for _, pid := range []int{a.PID, b.PID, c.PID} {
			if !running(pid) {
				t.Fatalf("tree %d was touched", pid)
			}
		}
		if tr := findByPGID(rep, c.PGID); tr == nil || tr.Action != action.WouldReap {
			t.Fatalf("uncontradicted tree: %+v", tr)
		}
		if rep.LivenessKnown {
			t.Error("report says liveness known")
		}
	})

	// The first run spares the tree; its --apply must not then collect
	// the ledger record that was the evidence, or the next run, seeing no
	// evidence left, reaps the tree of a container that still runs.
	t.Run("the evidence outlives an apply run", func(t *testing.T) {
		kept := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{Comm: comm, ContainerID: cidInit})
		store, err := ledger.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		initCmd := exec.Command("sleep", "1000")
		proc.Start(t, initCmd)
		st := startOf(t, initCmd.Process.Pid)
		if err := store.Update(cidInit, func(r *ledger.Record) error {
			r.Init = &ledger.Process{PID: initCmd.Process.Pid, StartTicks: st}
			r.Stages = map[string]time.Time{"createRuntime": time.Now()}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		opt := base
		opt.Store = store
		opt.Containers = map[string]bool{cidInit: true}
		for run := 1; run <= 2; run++ {
			rep, err := Run(context.Background(), opt, empty)
			if err != nil {
				t.Fatal(err)
			}
			if tr := findByPGID(rep, kept.PGID); tr == nil || tr.Action != action.SkipContradicted {
				t.Fatalf("run %d: tree of a container whose init runs: %+v", run, tr)
			}
			if rep.LedgerCollected != 0 {
				t.Fatalf("run %d collected %d records", run, rep.LedgerCollected)
			}
			if _, err := store.Load(cidInit); err != nil {
				t.Fatalf("run %d: the record is gone: %v", run, err)
			}
		}
		if !running(kept.PID) {
			t.Fatal("the contradicted tree was signalled")
		}
	})
}

func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.StartTicks
}

func running(pid int) bool {
	st, err := fingerprint.ReadStat("/proc", pid)
	return err == nil && !st.Zombie()
}
