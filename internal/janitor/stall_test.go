package janitor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// hungSocket listens on dir/kc-<pid>.sock, accepts and never answers;
// accepted is closed at the first connection (a probe under way).
func hungSocket(t *testing.T, dir string) (accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf("kc-%d.sock", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(ch) })
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ch
}

// TestDeathNotBehindStalledSweep: while a round's sweep waits on a socket
// that accepts and never answers (a 30 s probe timeout), a container death
// Docker reports (a Docker Engine API on a real unix socket) is handled
// within a second: the round holds the lock deaths take only for its
// reconcile step.
func TestDeathNotBehindStalledSweep(t *testing.T) {
	b := make([]byte, 32)
	rand.Read(b)
	id := hex.EncodeToString(b)
	sockDir := t.TempDir()
	accepted := hungSocket(t, sockDir)

	events := make(chan string, 1)
	dockerSock := dockertest.API(t, t.TempDir(), func() string { return "[]" }, events)

	w := &Watch{
		Settings: Settings{
			Engines:   []string{"docker"},
			Engine:    engine.Config{DockerURL: "unix://" + dockerSock, Timeout: 10 * time.Second},
			StateDir:  t.TempDir(),
			Reconcile: reconcile.Options{Comms: []string{"kc-stall-none"}},
			Sockets:   sweep.Config{Dirs: []string{sockDir}, Timeout: 30 * time.Second, DialTimeout: time.Second},
		},
		ReconcileOn: true,
		Events:      true,
		Interval:    time.Hour,
	}
	log, buf := jsonLogger()
	ctx, cancel := context.WithCancel(t.Context())
	stopping := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, stopping, log) }()
	defer func() {
		close(stopping)
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("watch did not stop")
		}
	}()

	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s after 30 s:\n%s", what, buf.b.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("subscription", func() bool { return len(buf.records("following container deaths")) > 0 })
	select {
	case <-accepted:
	case <-time.After(30 * time.Second):
		t.Fatalf("the sweep never probed the hung socket:\n%s", buf.b.String())
	}
	start := time.Now()
	events <- fmt.Sprintf(`{"Type":"container","Action":"die","timeNano":%d,"Actor":{"ID":%q}}`+"\n", start.UnixNano(), id)
	wait("handled death", func() bool {
		for _, r := range buf.records("container death handled") {
			if r["container"] == id {
				return true
			}
		}
		return false
	})
	took := time.Since(start)
	t.Logf("death handled %v after it was reported, the sweep still waiting on the hung socket", took)
	if len(buf.records("sweep")) > 0 {
		t.Fatal("the sweep ended before the death was handled: the test proved nothing")
	}
	// The sweep waits 30 s on its socket; a loaded machine may take a
	// while over the death, but nothing near that.
	if took > 5*time.Second {
		t.Errorf("death handled %v after it was reported, want < 5 s while the sweep is stalled for 30 s", took)
	}
}
