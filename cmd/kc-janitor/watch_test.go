package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestWatchCommand: the real command with podman unreachable keeps running
// round after round, writes metrics after each, and stops cleanly on
// SIGTERM with 143, the status the units count as a stop.
func TestWatchCommand(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "watch.log")
	mf := filepath.Join(dir, "kc.prom")
	socks := t.TempDir()
	orphanSock(t, socks, goneSockName(t))
	t.Setenv("PATH", t.TempDir())

	type result struct {
		code int
		out  string
	}
	res := make(chan result, 1)
	go func() {
		code, out := runJanitorCapture(t, "watch", "--interval", "100ms", "--podman-url", "unix:///nonexistent/podman.sock",
			"--podman-timeout", "1s", "--socket-dir", socks, "--state-dir", filepath.Join(dir, "state"),
			"--log-file", logFile, "--log-format", "json", "--metrics-file", mf)
		res <- result{code, out}
	}()
	// Signal only once the handler is installed: it is before "watching"
	// is logged, and SIGTERM without it would kill the test binary.
	proc.WaitFor(t, time.Minute, "the log lines", func() bool { return countLines(logFile, `"msg":"round failed`) >= 3 })
	if _, err := os.Stat(mf); err != nil {
		t.Errorf("no metrics after three rounds: %v", err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d after SIGTERM, want 143: %s", r.code, r.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not stop on SIGTERM")
	}
	if countLines(logFile, `"msg":"stopped"`) != 1 {
		data, _ := os.ReadFile(logFile)
		t.Errorf("no clean stop in the log:\n%s", data)
	}
	fams := readMetrics(t, mf)
	if v, ok := gauge(fams, metrics.GroundTruthKnown, "command", "watch"); !ok || v != 0 {
		t.Errorf("ground truth known %v %v", v, ok)
	}
	if v, ok := gauge(fams, metrics.SocketsStale); !ok || v != 1 {
		t.Errorf("stale sockets %v %v", v, ok)
	}
	for cmd, want := range map[string]float64{"reconcile": 0, "sweep": 1, "cull": 1, "watch": 0} {
		if v, ok := gauge(fams, metrics.RunSuccess, "command", cmd); !ok || v != want {
			t.Errorf("%s success %v %v, want %v", cmd, v, ok, want)
		}
	}
}

// TestWatchOnce: one round, the round's worst exit code; the dry-run
// sweep keeps the orphan socket.
func TestWatchOnce(t *testing.T) {
	socks := t.TempDir()
	sock := orphanSock(t, socks, goneSockName(t))
	t.Setenv("PATH", t.TempDir())
	code, _ := runJanitorCapture(t, "watch", "--once", "--podman-url", "unix:///nonexistent/podman.sock", "--socket-dir", socks)
	if code != exitUnknown {
		t.Errorf("exit %d, want 3 (ground truth unknown)", code)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("a dry-run round removed the socket: %v", err)
	}
	code, _ = runJanitorCapture(t, "watch", "--once", "--podman-url", "unix:///nonexistent/podman.sock", "--socket-dir", socks, "--sweep-apply")
	if code != exitUnknown {
		t.Errorf("exit %d", code)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Error("--sweep-apply left the stale socket")
	}
	// Without reconcile, podman is not asked: the round succeeds.
	code, _ = runJanitorCapture(t, "watch", "--once", "--no-reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--socket-dir", socks)
	if code != exitOK {
		t.Errorf("--no-reconcile: exit %d, want 0", code)
	}
	if code, _ := runJanitorCapture(t, "watch", "--interval", "0s"); code != exitUsage {
		t.Errorf("--interval 0s: exit %d, want 2", code)
	}
}

func countLines(path, substr string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(data), substr)
}

// TestWatchSecondSignalAbandonsATargetLookup: a watch scoped to a
// container looks it up again each round to reach its sockets; with its
// engine hung there, a second SIGTERM abandons the lookup at once, as the
// help promises, instead of waiting out --podman-timeout.
func TestWatchSecondSignalAbandonsATargetLookup(t *testing.T) {
	id := strings.Repeat("5f", 32)
	var lists atomic.Int32
	u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/containers/json") {
			http.NotFound(w, r)
			return
		}
		if lists.Add(1) == 1 {
			fmt.Fprintf(w, `[{"Id":%q,"State":"running","Names":["web"],"Pid":%d}]`, id, os.Getpid())
			return
		}
		<-r.Context().Done() // hung from the first round on
	})
	dir := t.TempDir()
	logFile := filepath.Join(dir, "watch.log")
	res := make(chan int, 1)
	go func() {
		code, _ := runJanitorCapture(t, "watch", "--interval", "1h", "--engine", "podman", "--podman-url", u,
			"--podman-timeout", "30s", "--container", "web", "--no-reconcile", "--no-cull",
			"--state-dir", filepath.Join(dir, "state"), "--log-file", logFile, "--log-format", "json")
		res <- code
	}()
	proc.WaitFor(t, time.Minute, "the round's lookup", func() bool { return lists.Load() >= 2 && countLines(logFile, `"msg":"watching"`) == 1 })
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Two signals, not one the kernel coalesced.
	proc.WaitFor(t, time.Minute, "the first signal taken", func() bool { return countLines(logFile, `"msg":"stopping after the current round"`) == 1 })
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("watch still waiting on the hung engine 10s after a second SIGTERM")
	}
}
