package pgkill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// killAsEnv makes the test binary a helper that runs Kill on the group
// given as JSON in the variable and prints the result as JSON.
const killAsEnv = "KC_PGKILL_KILL_HELPER"

type killReport struct {
	Outcome action.Action
	Signals []syscall.Signal
	Joiners []fingerprint.Stat
	Err     string
}

// killHelper is run from TestMain.
func killHelper(spec string) int {
	var g pgkill.Group
	if err := json.Unmarshal([]byte(spec), &g); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: 100 * time.Millisecond, Poll: 5 * time.Millisecond, KillWait: time.Second})
	rep := killReport{Outcome: res.Outcome, Signals: res.Signals, Joiners: res.Joiners}
	if res.Err != nil {
		rep.Err = res.Err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// TestKillNotPermitted: an unprivileged caller cannot signal root's group;
// Kill must say so (would not die, EPERM) rather than report it gone.
func TestKillNotPermitted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the caller as another user")
	}
	cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
	g := startGroup(t, cmds...)
	rep := killAsNobody(t, g)
	if rep.Outcome != action.WouldNotDie || len(rep.Signals) != 0 || !strings.Contains(rep.Err, "operation not permitted") {
		t.Errorf("Kill as uid 65534 = %+v; want would-not-die with EPERM, no signal", rep)
	}
	for _, st := range g.Members {
		now := proc.MustStat(t, root, st.PID)
		if !fingerprint.Alive(root, st) || now.State != 'S' {
			t.Errorf("member %d in state %c after a refused Kill", st.PID, now.State)
		}
	}
}

// TestKillJoinerNotPermitted: the group is the caller's (uid 65534) and
// its members die on SIGTERM, but a root process joined it after it was
// recorded. The caller cannot signal that joiner: Kill must report the
// group would not die, with EPERM, rather than reaped.
func TestKillJoinerNotPermitted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes and the caller as another user")
	}
	nobody := testutil.NobodyCredential()
	cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
	var g pgkill.Group
	for _, cmd := range cmds {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.PGID, Credential: nobody}
		proc.Start(t, cmd)
		if g.PGID == 0 {
			g.PGID = cmd.Process.Pid
		}
		g.Members = append(g.Members, waitSleeping(t, cmd.Process.Pid))
	}
	joiner := startInGroup(t, trapCmd(), g.PGID)
	if uid, err := proc.StatusField(root, joiner.Process.Pid, "Uid"); err != nil || !strings.HasPrefix(uid, "0\t") {
		t.Fatalf("test setup: joiner %d has uids %q (%v), want root's", joiner.Process.Pid, uid, err)
	}

	rep := killAsNobody(t, g)
	t.Logf("Kill as uid 65534: %s, signals %v: %s", rep.Outcome, rep.Signals, rep.Err)
	if rep.Outcome != action.WouldNotDie || !reflect.DeepEqual(rep.Signals, []syscall.Signal{syscall.SIGTERM}) ||
		!strings.Contains(rep.Err, "operation not permitted") {
		t.Errorf("Kill as uid 65534 = %+v; want would-not-die with EPERM after one SIGTERM", rep)
	}
	if len(rep.Joiners) != 1 || rep.Joiners[0].PID != joiner.Process.Pid {
		t.Errorf("Kill reported joiners %+v, want only %d", rep.Joiners, joiner.Process.Pid)
	}
	for _, cmd := range cmds {
		if sig := exitSignal(t, cmd); sig != syscall.SIGTERM {
			t.Errorf("member %d ended by %v, want SIGTERM", cmd.Process.Pid, sig)
		}
	}
	// Asleep, not stopped or dying (it may still have been starting up
	// when Kill returned).
	if st := proc.WaitState(t, root, joiner.Process.Pid, "S", waitLong); st.PGID != g.PGID {
		t.Errorf("joiner %d left group %d for %d", st.PID, g.PGID, st.PGID)
	}
}

// killAsNobody runs Kill on g in a copy of this test binary running as
// uid 65534 and returns what it reported.
func killAsNobody(t *testing.T, g pgkill.Group) killReport {
	t.Helper()
	spec, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}

	dir := testutil.OpenTempDir(t, "kc-pgkill-eperm-", 0o755)
	cmd := testutil.SelfAsNobody(t, dir, "pgkill.test", killAsEnv+"="+string(spec))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v; stderr: %s", err, exitStderr(err))
	}
	var rep killReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	return rep
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
