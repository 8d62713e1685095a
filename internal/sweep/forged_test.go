package sweep

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestForgedNetUnixLineKeepsNoOrphan: a user binds a socket whose name
// holds a newline and a made-up /proc/net/unix line naming root's orphan
// as a listener. Gate 2 reads the host's table from sock_diag, which no
// name can forge: the orphan is stale and unlinked (read from net/unix,
// it was "listener in net/unix", kept every run).
func TestForgedNetUnixLineKeepsNoOrphan(t *testing.T) {
	dir := shortTemp(t)
	orphan := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if !testutil.ForgeNetUnixLine(t, dir, orphan) {
		t.Fatalf("the forged name does not fit under %s", dir)
	}
	cfg := fastConfig(dir)
	cfg.Apply = true
	got := sweep(t, cfg)
	if s := got[orphan]; s == nil || s.Verdict != VerdictStale || testutil.PathExists(orphan) {
		t.Errorf("orphan: %+v; want stale and unlinked", s)
	}
}

// TestSameNetNS: the host and processes on its network read sock_diag's
// table; a process in a network namespace of its own does not.
func TestSameNetNS(t *testing.T) {
	other := exec.Command("sleep", "1000")
	other.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := other.Start(); err != nil {
		t.Skipf("no network namespace here: %v", err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	for _, tc := range []struct {
		name string
		pid  int
		want bool
	}{
		{"the host", 0, true},
		{"a process on the host's network", os.Getpid(), true},
		{"a process in a namespace of its own", other.Process.Pid, false},
		{"no such process", deadPID(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameNetNS("/proc", tc.pid); got != tc.want {
				t.Errorf("sameNetNS(%d) = %v, want %v", tc.pid, got, tc.want)
			}
		})
	}
}
