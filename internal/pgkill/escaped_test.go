package pgkill

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestSignalPinnedRefusesTheWrongTarget: an escaped member is signalled
// by itself, with no group to vouch for it; its identity is all there is.
// A recorded identity whose PID now names another process gets nothing,
// nor does a thread ID, nor one that runs as another UID than the tree's
// now (a setuid program run since the scan); the recorded process gets
// the signal.
func TestSignalPinnedRefusesTheWrongTarget(t *testing.T) {
	inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setsid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	st := proc.MustStat(t, fingerprint.DefaultRoot, inn.PID)
	recycled := st
	recycled.StartTicks++ // the recorded process was another one
	uid := os.Geteuid()
	for _, tt := range []struct {
		name string
		m    fingerprint.Stat
		// uids: the tree's UID and those KillEscaped adds
		// (Options.MemberUIDs: a setpriv'd command's, supervise's -1).
		uids    []int
		want    int
		wantErr bool
	}{
		{"recycled PID", recycled, []int{uid}, 0, false},
		{"thread ID", threadOf(t, inn.PID), []int{uid}, 0, false},
		{"runs as another UID now", st, []int{uid + 4242}, 0, true},
		{"runs as none of the tree's UIDs", st, []int{uid + 4242, -1}, 0, true},
		{"the recorded process (control)", st, []int{uid}, 1, false},
		{"one of the tree's UIDs (control)", st, []int{uid + 4242, uid}, 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, err := inn.Sync()
			if err != nil {
				t.Fatal(err)
			}
			sent, err := signalEach(fingerprint.DefaultRoot, []fingerprint.Stat{tt.m}, tt.uids, syscall.SIGUSR1)
			if (err != nil) != tt.wantErr || sent != (tt.want > 0) {
				t.Errorf("signalEach = %v, %v", sent, err)
			}
			// The innocent's sync can overtake a signal another of its
			// threads took: wait for the one expected.
			after := caughtAtLeast(t, inn, before+tt.want)
			if got := after - before; got != tt.want {
				t.Errorf("innocent caught %d signals (%v), want %d", got, inn.Caught(), tt.want)
			}
		})
	}
}

// TestKillEscapedRefusesTheCallerAndInit: neither the caller nor PID 1
// is ever signalled, whatever a walk recorded.
func TestKillEscapedRefusesTheCallerAndInit(t *testing.T) {
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGTERM)
	defer signal.Stop(caught)
	self := proc.MustStat(t, fingerprint.DefaultRoot, os.Getpid())
	r := KillEscaped(context.Background(), []fingerprint.Stat{self, {PID: 1}}, os.Geteuid(), Options{Grace: 50 * time.Millisecond})
	if r.Outcome != action.WouldNotDie || r.Err == nil {
		t.Errorf("KillEscaped(self, 1) = %v, %v; want a refusal", r.Outcome, r.Err)
	}
	select {
	case <-caught:
		t.Error("the calling process caught SIGTERM")
	case <-time.After(100 * time.Millisecond):
	}
	// PID 1 as it really is (its start time too, so that no other check
	// refuses it first): refused as a target. Signal 0 does nothing to
	// init should the guard ever fail.
	init, err := fingerprint.ReadStat(fingerprint.DefaultRoot, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := signalPinned(fingerprint.DefaultRoot, init, []int{0}, 0); !errors.Is(err, errRefusedTarget) {
		t.Errorf("signalPinned(init) = %v, want %v", err, errRefusedTarget)
	}
}

// TestKillEscapedGoesOnPastARefusal: a member refused (it runs as
// another UID now) is said, and left alone; the others still get the
// grace and SIGKILL.
func TestKillEscapedGoesOnPastARefusal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a process of another user")
	}
	stubborn := exec.Command("sh", "-c", `trap "" TERM; exec sleep 1000`)
	stubborn.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	proc.Start(t, stubborn)
	other := exec.Command("sleep", "1000")
	other.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	proc.Start(t, other)
	var st, ost fingerprint.Stat
	proc.WaitFor(t, 5*time.Second, "both to exec sleep", func() bool {
		var err, oerr error
		st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, stubborn.Process.Pid)
		ost, oerr = fingerprint.ReadStat(fingerprint.DefaultRoot, other.Process.Pid)
		return err == nil && oerr == nil && st.Comm == "sleep" && ost.Comm == "sleep"
	})
	r := KillEscaped(context.Background(), []fingerprint.Stat{ost, st}, 0, Options{Grace: 100 * time.Millisecond, KillWait: 300 * time.Millisecond})
	if r.Outcome != action.WouldNotDie || r.Err == nil || len(r.Signals) != 2 {
		t.Errorf("KillEscaped = %v %v %v; want SIGTERM and SIGKILL sent, the refusal said", r.Outcome, r.Signals, r.Err)
	}
	if fingerprint.Alive(fingerprint.DefaultRoot, st) {
		t.Error("the tree's member ignoring SIGTERM lives on")
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, ost) {
		t.Error("another user's process was killed")
	}
}

// TestKillEscapedKillsOutsideAnyGroup: a process in a session of its own
// that ignores SIGTERM dies of the SIGKILL after the grace, signalled
// through its pidfd (no killpg could reach it by the tree's group).
func TestKillEscapedKillsOutsideAnyGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", `trap "" TERM; exec sleep 1000`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	proc.Start(t, cmd)
	var st fingerprint.Stat
	proc.WaitFor(t, 5*time.Second, "the trap to exec sleep", func() bool {
		var err error
		st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid)
		return err == nil && st.Comm == "sleep"
	})
	r := KillEscaped(context.Background(), []fingerprint.Stat{st}, os.Geteuid(), Options{Grace: 100 * time.Millisecond})
	if r.Outcome != action.Reaped || r.Err != nil || len(r.Signals) != 2 {
		t.Fatalf("KillEscaped = %v %v %v; want reaped after SIGTERM and SIGKILL", r.Outcome, r.Signals, r.Err)
	}
	if fingerprint.Alive(fingerprint.DefaultRoot, st) {
		t.Error("it lives on")
	}
}
