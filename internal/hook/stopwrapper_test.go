package hook

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
	supervisetest "github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
)

// TestStopWrapperRefusesARecycledGroup: the recorded wrapper is gone and
// an innocent process now leads a group with the wrapper's old PID and
// PGID. Listing that group must not turn the innocent into an "original
// member" that pgkill would then signal.
func TestStopWrapperRefusesARecycledGroup(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	innocent, err := fingerprint.ReadStat("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// The wrapper as recorded: same PID and group, an earlier start.
	wrapper := innocent
	wrapper.StartTicks--

	cfg := Config{KillGrace: 100 * time.Millisecond, Deadline: time.Second}
	if err := stopWrapper(cfg, wrapper); err != nil {
		t.Fatalf("stopWrapper = %v", err)
	}
	st, err := fingerprint.ReadStat("/proc", innocent.PID)
	if err != nil || !fingerprint.Same(st, innocent) || st.Zombie() || st.State == 'T' {
		t.Fatalf("the innocent group leader was harmed: %+v, %v", st, err)
	}
}

// TestStopWrapperWithNoTimeLeft: with less time before the stage's
// deadline than a launch needs, the earlier wrapper is not signalled at
// all (a TERM with no time to follow it up would leave it half stopped,
// and the launch is given up anyway).
func TestStopWrapperWithNoTimeLeft(t *testing.T) {
	w, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cfg := Config{KillGrace: 100 * time.Millisecond, Until: time.Now().Add(LaunchMargin / 2)}
	if err := stopWrapper(cfg, w.Stat); err == nil {
		t.Fatal("stopWrapper = nil, want an error: no time left")
	}
	if n, what := w.Harm(); n > 0 {
		t.Fatalf("the wrapper was signalled: %s", what)
	}
}

// startWrapperWithOtherUsersMember starts bash running script as a
// stand-in for an earlier wrapper, in a group of its own, and waits for
// the member of uid 65534 the script starts (a command that ran setpriv
// without setsid). Cleanup kills the group.
func startWrapperWithOtherUsersMember(t *testing.T, script string) (wrapper, other fingerprint.Stat) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: setpriv to another user")
	}
	cmd := exec.Command("bash", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	wrapper, err := fingerprint.ReadStat("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	supervisetest.Eventually(t, 10*time.Second, "the member of uid 65534", func() bool {
		for _, m := range pgkill.Members("/proc", wrapper.PGID) {
			if ids, err := fingerprint.ReadUIDs("/proc", m.PID); err == nil && ids[0] == 65534 && m.Comm == "sleep" {
				other = m
				return true
			}
		}
		return false
	})
	return wrapper, other
}

// TestStopWrapperSparesAnotherUsersMember: an earlier wrapper's group
// holds a member running as another user. Stopping that wrapper on a
// restart stops the wrapper (which takes its group down by its own rules)
// and does not signal the member itself.
func TestStopWrapperSparesAnotherUsersMember(t *testing.T) {
	wrapper, other := startWrapperWithOtherUsersMember(t, "setpriv --reuid=65534 --regid=65534 --clear-groups sleep 1000001 & wait")
	cfg := Config{KillGrace: 100 * time.Millisecond, Deadline: time.Second}
	if err := stopWrapper(cfg, wrapper); err != nil {
		t.Errorf("stopWrapper = %v, want the wrapper stopped", err)
	}
	if fingerprint.Alive("/proc", wrapper) {
		t.Error("the wrapper was not stopped")
	}
	if !fingerprint.Alive("/proc", other) {
		t.Fatal("stopWrapper killed a member of another user")
	}
}

// TestStopWrapperThatIgnoresTERM: an earlier wrapper that does not exit
// on SIGTERM gets the group kill as its UID, which refuses a group that
// holds another user's member: both are left, and the launch is told.
func TestStopWrapperThatIgnoresTERM(t *testing.T) {
	wrapper, other := startWrapperWithOtherUsersMember(t, `trap "" TERM; setpriv --reuid=65534 --regid=65534 --clear-groups sleep 1000001 & wait`)
	cfg := Config{KillGrace: 100 * time.Millisecond, Deadline: time.Second}
	if err := stopWrapper(cfg, wrapper); err == nil {
		t.Error("stopWrapper = nil; want the refusal said (the group is not one UID's)")
	}
	if !fingerprint.Alive("/proc", other) || !fingerprint.Alive("/proc", wrapper) {
		t.Error("the group kill signalled a group holding another user's member")
	}
}
