package pgkill_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// A pinned member that is no longer in the group it was pinned for gets
// no signal at all: not the group's, and not the stop and continue that
// prove its membership.
func TestSignalWhilePinnedLeftGroupGetsNothing(t *testing.T) {
	inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	other := startGroup(t, sleepCmd())
	pin, err := fingerprint.Pin(root, st)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	// The innocent was pinned as a member of other's group and has left it
	// since (it leads its own group).
	if err := pgkill.SignalWhilePinned(root, other.PGID, pin, 0); err == nil {
		t.Fatal("signalled a group through a member that is not in it")
	}
	if n, what := inn.Harm(); n > 0 {
		t.Fatalf("a member outside the group was signalled: %s", what)
	}
}

// A member its owner had stopped stays stopped: the janitor must not
// continue it.
func TestSignalWhilePinnedKeepsOwnersStop(t *testing.T) {
	inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	if err := unix.Kill(inn.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, inn.PID, 'T')
	pin, err := fingerprint.Pin(root, st)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	if err := pgkill.SignalWhilePinned(root, inn.PID, pin, 0); err != nil {
		t.Fatalf("signal 0 to a stopped member's own group: %v", err)
	}
	now, err := fingerprint.ReadStat(root, inn.PID)
	if err != nil {
		t.Fatal(err)
	}
	if now.State != 'T' {
		t.Fatalf("the owner's stop was undone: state %c, want T", now.State)
	}
	if err := unix.Kill(inn.PID, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	proc.WaitFor(t, waitLong, "the innocent to report the owner's SIGCONT", func() bool {
		n, _ := inn.Sync()
		return n > 0
	})
	if c := inn.Caught(); len(c) != 1 || c[0] != "SIGCONT" {
		t.Fatalf("caught %v, want only the owner's SIGCONT", c)
	}
}

// A group whose members were stopped before the janitor came still dies:
// they keep their owner's stop, so SIGTERM waits and SIGKILL ends them.
func TestKillStoppedGroup(t *testing.T) {
	g := startGroup(t, sleepCmd(), sleepCmd())
	if err := unix.Kill(-g.PGID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, m := range g.Members {
		waitState(t, m.PID, 'T')
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	r := pgkill.Kill(ctx, g, pgkill.Options{Root: root, Grace: 200 * time.Millisecond})
	if r.Outcome != action.Reaped {
		t.Fatalf("outcome %s (%v), want %s", r.Outcome, r.Err, action.Reaped)
	}
}

func waitState(t *testing.T, pid int, state byte) {
	t.Helper()
	proc.WaitFor(t, waitLong, "state "+string(state), func() bool {
		st, err := fingerprint.ReadStat(root, pid)
		return err == nil && st.State == state
	})
}
