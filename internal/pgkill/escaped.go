package pgkill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// KillEscaped takes down a tree's members that left its process group (a
// setsid child, a daemon; DESIGN "Descendants that leave the group"). No group vouches for them, so each
// is signalled on its own through a pidfd opened before its identity (PID
// and start time) is read again: a PID handed to another process since
// the scan is never signalled, and neither is the caller, nor one that
// no longer runs wholly as uid, or one of opt.MemberUIDs (real, effective
// and saved: a setuid program run since the scan keeps only the real
// one). SIGTERM, the
// grace, SIGKILL, as Kill does for a group; the outcome is Reaped when
// every one is dead, Gone when none was left to signal, WouldNotDie
// otherwise.
func KillEscaped(ctx context.Context, procs []fingerprint.Stat, uid int, opt Options) Result {
	opt = opt.withDefaults()
	res := Result{Outcome: action.Gone}
	if len(procs) == 0 {
		return res
	}
	g := Group{Members: procs}
	uids := append([]int{uid}, opt.MemberUIDs...)
	// A member refused (one running as another UID now) is said at the
	// end; the others still get the grace and SIGKILL.
	sent, termErr := signalEach(opt.Root, procs, uids, unix.SIGTERM)
	if !sent {
		if termErr != nil {
			res.Outcome, res.Err = action.WouldNotDie, termErr
		}
		return res
	}
	res.Signals = append(res.Signals, unix.SIGTERM)
	graceCtx, cancel := context.WithTimeout(ctx, opt.Grace)
	dead := waitDead(graceCtx, opt, g)
	cancel()
	if dead {
		res.Outcome = action.Reaped
		return res
	}
	sent, killErr := signalEach(opt.Root, alive(opt.Root, g), uids, unix.SIGKILL)
	if sent {
		res.Signals = append(res.Signals, unix.SIGKILL)
	}
	killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opt.KillWait)
	defer cancel()
	if waitDead(killCtx, opt, g) {
		res.Outcome = action.Reaped
		return res
	}
	res.Outcome = action.WouldNotDie
	res.Err = errors.Join(fmt.Errorf("escaped members still alive after SIGKILL: %s", describe(alive(opt.Root, g))), cmp.Or(killErr, termErr))
	return res
}

// SignalEach sends sig once to each of procs through a pidfd, under
// KillEscaped's rules (the recorded process still, running wholly as one
// of uids, never the caller), and reports whether any was signalled. A
// contained tree's sweep uses it on a frozen cgroup, where a SIGTERM and
// its grace would only wait.
func SignalEach(root string, procs []fingerprint.Stat, uids []int, sig syscall.Signal) (bool, error) {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	return signalEach(root, procs, uids, sig)
}

// signalEach signals every process that is still the recorded one and
// reports whether any was signalled; a process that is gone or whose PID
// now names another is skipped, any other failure (EPERM) is an error
// once the rest have been tried.
func signalEach(root string, procs []fingerprint.Stat, uids []int, sig syscall.Signal) (bool, error) {
	var sent bool
	var errs []error
	for _, m := range procs {
		err := signalPinned(root, m, uids, sig)
		switch {
		case err == nil:
			sent = true
		case notOccupying(err):
		default:
			errs = append(errs, err)
		}
	}
	return sent, errors.Join(errs...)
}

// signalPinned signals m through a pidfd once the pidfd is proven to be
// m's (fingerprint.Pin) and m still runs wholly as one of uids; never the
// caller.
func signalPinned(root string, m fingerprint.Stat, uids []int, sig syscall.Signal) error {
	if m.PID == os.Getpid() || m.PID <= 1 {
		return fmt.Errorf("pid %d is never signalled: %w", m.PID, errRefusedTarget)
	}
	pin, err := fingerprint.Pin(root, m)
	if err != nil {
		return fmt.Errorf("escaped member %d: %w", m.PID, err)
	}
	defer pin.Close()
	u, err := runsAsOneOf(root, m, uids)
	if err != nil {
		return fmt.Errorf("escaped member %d: %w", m.PID, err)
	}
	if _, err := asUID(u, func() error { return pin.Signal(sig) }); err != nil {
		return fmt.Errorf("escaped member %d: %w", m.PID, err)
	}
	return nil
}

// runsAsOneOf checks, once a pidfd holds m, that m runs wholly as one of
// uids, and returns that UID, which the signal then goes out as
// (asUID): a process that switched wholly to another UID after this read
// gets nothing. Its status read,
// proven m's by the stat read after. status only: its argv would take
// the process's memory lock, which a thread of its can hold (a FUSE
// server's read). A setuid program keeps its caller's real UID: the
// effective and saved ones must be one of uids too.
func runsAsOneOf(root string, m fingerprint.Stat, uids []int) (int, error) {
	ids, err := fingerprint.ReadUIDs(root, m.PID)
	if err == nil {
		_, err = fingerprint.Revalidate(root, m)
	}
	if err != nil {
		return -1, err
	}
	u := fingerprint.SoleUID(ids)
	if u < 0 || !slices.Contains(uids, u) {
		return -1, fmt.Errorf("it runs as uids %v (real, effective, saved), none of the tree's %v: %w", ids, uids, errRefusedTarget)
	}
	return u, nil
}

// errRefusedTarget: the caller itself or init, which no tree can hold.
var errRefusedTarget = errors.New("refused target")
