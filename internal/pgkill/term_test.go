package pgkill

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestTerminateRefusesTheWrongTarget: Terminate signals the process it was
// given and nothing else: a recycled PID (another start time), a thread
// ID and the caller get nothing; the right process gets SIGTERM and
// is waited for.
func TestTerminateRefusesTheWrongTarget(t *testing.T) {
	inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	recycled := inn.Stat
	recycled.StartTicks++
	self := proc.MustStat(t, fingerprint.DefaultRoot, os.Getpid())
	for _, tc := range []struct {
		name string
		m    fingerprint.Stat
	}{
		{"recycled PID", recycled},
		{"thread ID", threadOf(t, inn.PID)},
		{"the caller", self}, // were it signalled, the test would die of it
	} {
		t.Run(tc.name, func(t *testing.T) {
			Terminate(fingerprint.DefaultRoot, tc.m, 10*time.Millisecond)
			if n, what := inn.Harm(); n > 0 {
				t.Errorf("the innocent was harmed: %s", what)
			}
		})
	}

	t.Run("the process given", func(t *testing.T) {
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		st := proc.MustStat(t, fingerprint.DefaultRoot, cmd.Process.Pid)
		if gone, err := Terminate(fingerprint.DefaultRoot, st, 10*time.Second); !gone || err != nil {
			t.Errorf("Terminate = %v, %v; want it gone", gone, err)
		}
	})
	t.Run("one that ignores SIGTERM", func(t *testing.T) {
		cmd := exec.Command("sh", "-c", "trap '' TERM; echo ready; exec sleep 1000")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		buf := make([]byte, 6)
		if _, err := out.Read(buf); err != nil {
			t.Fatal(err)
		}
		st := proc.MustStat(t, fingerprint.DefaultRoot, cmd.Process.Pid)
		if gone, _ := Terminate(fingerprint.DefaultRoot, st, 200*time.Millisecond); gone {
			t.Error("Terminate says gone; want it still running after the wait")
		}
	})
}
