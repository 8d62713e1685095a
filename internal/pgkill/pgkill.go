// Package pgkill kills a process group without ever signalling a group that
// the caller did not record.
//
// Between the scan that found a group and the signal that ends it, any of
// its members may exit and their numbers be handed to unrelated processes.
// A process group number stays allocated while at least one process (even a
// zombie) holds it, so a group is provably the recorded one as long as one
// original member — same PID, same start time, same PGID — is still in it.
// Before every killpg this package pins such a member with a pidfd, stops it
// (a stopped process cannot exit on its own, so the group cannot empty and
// be reborn under us), re-verifies it, and only then signals the group.
package pgkill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Outcome is the result of killing one group.
type Outcome string

const (
	// Reaped: the group was signalled and every original member is dead.
	Reaped Outcome = "reaped"
	// Gone: no original member occupied the group any more; nothing was
	// signalled.
	Gone Outcome = "gone"
	// WouldNotDie: signalling failed (EPERM) or members survived SIGKILL.
	WouldNotDie Outcome = "would-not-die"
)

// Group is a recorded process group: its ID and the identities of the
// members seen when it was scanned.
type Group struct {
	PGID    int
	Members []fingerprint.Stat
}

// Options tune Kill. The zero value is usable.
type Options struct {
	// Root is the procfs mount; default /proc.
	Root string
	// Grace is how long to wait after SIGTERM before SIGKILL; default 5s.
	Grace time.Duration
	// Poll is the longest wait between liveness checks; default 20ms.
	// A member's exit ends the wait early when it could be pinned.
	Poll time.Duration
	// KillWait bounds the wait after SIGKILL; default 3s.
	KillWait time.Duration
}

func (o Options) withDefaults() Options {
	if o.Root == "" {
		o.Root = fingerprint.DefaultRoot
	}
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Millisecond
	}
	if o.KillWait <= 0 {
		o.KillWait = 3 * time.Second
	}
	return o
}

// Result reports what Kill did to one group.
type Result struct {
	PGID    int
	Outcome Outcome
	// Signals lists the signals that were sent to the group, in order.
	Signals []syscall.Signal
	Err     error
}

// errNoOccupant means no original member is in the group any more.
var errNoOccupant = errors.New("no original member occupies the group")

// Kill sends SIGTERM to the group, waits up to the grace for every original
// member to die, then sends SIGKILL. Each signal is preceded by the
// revalidation described in the package comment. Kill honours ctx: when it
// expires the group is killed at once and the result reflects the state at
// that point.
func Kill(ctx context.Context, g Group, opt Options) Result {
	opt = opt.withDefaults()
	res := Result{PGID: g.PGID}
	if g.PGID <= 1 || len(g.Members) == 0 {
		res.Outcome = WouldNotDie
		res.Err = fmt.Errorf("refusing to signal group %d with %d recorded members", g.PGID, len(g.Members))
		return res
	}

	err := signalGroup(opt.Root, g, unix.SIGTERM)
	switch {
	case errors.Is(err, errNoOccupant):
		res.Outcome = Gone
		return res
	case err != nil:
		res.Outcome, res.Err = WouldNotDie, err
		return res
	}
	res.Signals = append(res.Signals, unix.SIGTERM)

	graceCtx, cancel := context.WithTimeout(ctx, opt.Grace)
	dead := waitDead(graceCtx, opt, g)
	cancel()
	if dead {
		res.Outcome = Reaped
		return res
	}

	err = signalGroup(opt.Root, g, unix.SIGKILL)
	switch {
	case errors.Is(err, errNoOccupant):
		// The last original died between the poll and the revalidation.
		res.Outcome = Reaped
		return res
	case err != nil:
		res.Outcome, res.Err = WouldNotDie, err
		return res
	}
	res.Signals = append(res.Signals, unix.SIGKILL)

	// SIGKILL cannot be ignored; the wait only covers the kernel tearing
	// the processes down. It is bounded even when ctx has already expired.
	killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opt.KillWait)
	defer cancel()
	if waitDead(killCtx, opt, g) {
		res.Outcome = Reaped
		return res
	}
	res.Outcome = WouldNotDie
	res.Err = fmt.Errorf("group %d: still alive after SIGKILL: %s", g.PGID, describe(alive(opt.Root, g)))
	return res
}

// signalGroup sends sig to the group only while a pinned, stopped original
// member proves the group is the recorded one.
func signalGroup(root string, g Group, sig syscall.Signal) error {
	var unsure error
	for _, m := range g.Members {
		pin, err := occupant(root, g.PGID, m)
		if err != nil {
			if !notOccupying(err) {
				// Could not tell (no pidfd support, out of descriptors,
				// an unreadable /proc entry): not proof the member is
				// gone. Try the others, but never report the group gone.
				unsure = err
			}
			continue
		}
		err = signalWhilePinned(root, g.PGID, pin, sig)
		pin.Close()
		if errors.Is(err, errNoOccupant) {
			continue
		}
		return err
	}
	if unsure != nil {
		return fmt.Errorf("group %d: cannot verify its members: %w", g.PGID, unsure)
	}
	return errNoOccupant
}

// notOccupying reports whether err proves the recorded member no longer
// occupies the group: it is gone, its PID is another process's or a
// thread's, or it moved out of the group or exited.
func notOccupying(err error) bool {
	return errors.Is(err, errNoOccupant) || errors.Is(err, fingerprint.ErrNotFound) ||
		errors.Is(err, fingerprint.ErrRecycled) || errors.Is(err, fingerprint.ErrNotProcess)
}

// occupant pins m if it is alive, the recorded process, and still in pgid.
func occupant(root string, pgid int, m fingerprint.Stat) (*fingerprint.Pinned, error) {
	pin, err := fingerprint.Pin(root, m)
	if err != nil {
		return nil, err
	}
	if pin.PGID != pgid || pin.Zombie() {
		pin.Close()
		return nil, errNoOccupant
	}
	return pin, nil
}

func signalWhilePinned(root string, pgid int, pin *fingerprint.Pinned, sig syscall.Signal) error {
	if err := pin.Signal(unix.SIGSTOP); err != nil {
		if errors.Is(err, fingerprint.ErrNotFound) {
			return errNoOccupant // it exited after being pinned
		}
		// EPERM and the like: the group is there but not ours to
		// signal. Reporting it gone would hide a tree that survives.
		return err
	}
	stopped := waitStopped(root, pin.Stat)
	// Always let the pinned member run again: it must receive SIGTERM, and
	// if we bail out it must be left as we found it.
	defer pin.Signal(unix.SIGCONT) //nolint:errcheck // it may be dead by then

	st, err := fingerprint.Revalidate(root, pin.Stat)
	if err != nil || st.PGID != pgid || st.Zombie() {
		return errNoOccupant
	}
	_ = stopped // not stopped (uninterruptible sleep): the check above is the best there is
	if err := unix.Kill(-pgid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("killpg(%d, %v): %w", pgid, sig, err)
	}
	return nil
}

// waitStopped polls briefly until the pinned process reports a stopped
// state. SIGSTOP is delivered asynchronously.
func waitStopped(root string, want fingerprint.Stat) bool {
	for i := 0; i < 50; i++ {
		st, err := fingerprint.ReadStat(root, want.PID)
		if err != nil {
			return false
		}
		if st.State == 'T' || st.State == 't' {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// waitDead reports whether every original member is dead, looking again
// whenever a pinned member exits and at least every opt.Poll, until ctx is
// done. kc-hook runs this in each container's stop path, where a fixed
// tick would add most of an interval to every stop.
func waitDead(ctx context.Context, opt Options, g Group) bool {
	w := newExitWatch(opt.Root)
	defer w.close()
	for {
		live := alive(opt.Root, g)
		if len(live) == 0 {
			return true
		}
		if expired(ctx) {
			return false
		}
		w.wait(ctx, live, opt.Poll)
	}
}

// expired reports whether ctx is done or its deadline has passed; the
// latter can be seen a moment before ctx's own timer marks it done.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// alive returns the original members that are still the recorded, living
// processes. A zombie counts as dead: it has exited and only waits for its
// parent.
func alive(root string, g Group) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range g.Members {
		st, err := fingerprint.Revalidate(root, m)
		switch {
		case err == nil && st.Zombie():
		case err == nil, !notOccupying(err):
			// Alive, or not provably dead: an unreadable member must not
			// let a kill report success.
			out = append(out, m)
		}
	}
	return out
}

func describe(ms []fingerprint.Stat) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d(%s)", m.PID, m.Comm)
	}
	return strings.Join(parts, ", ")
}
