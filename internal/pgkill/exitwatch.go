package pgkill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// exitWatch lets waitDead sleep until an original member exits rather than
// until the next tick: a pidfd turns readable when its process exits. It
// only decides when to look again; alive() alone decides what is dead, so
// a wrong or missing pidfd can cost latency but never a wrong verdict.
type exitWatch struct {
	root  string
	pins  []watched
	tried map[identity]bool
	// wake is an eventfd written when ctx is done. poll(2) cannot wait on
	// a channel, and without it a cancelled Kill would sit out the rest of
	// the poll timeout before sending SIGKILL.
	wake     int
	wakeDone chan struct{}
	stopWake func() bool
	// ticker means pidfds are not to be had (no pidfd support, out of
	// descriptors, poll failing): wait out each interval as before.
	ticker bool
}

type watched struct {
	id  identity
	pin *fingerprint.Pinned
}

type identity struct {
	pid   int
	start uint64
}

// maxPins bounds the pidfds one wait holds.
const maxPins = 64

func newExitWatch(root string) *exitWatch {
	return &exitWatch{root: root, tried: map[identity]bool{}, wake: -1}
}

// wait returns after at most limit, never past ctx's deadline, sooner when
// a watched member exits, ctx is done, or a member turned out gone while
// being pinned. live are the members alive() reported just before.
func (w *exitWatch) wait(ctx context.Context, live []fingerprint.Stat, limit time.Duration) {
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	if limit <= 0 {
		return
	}
	// Armed before any pidfd is opened: pidfds that cannot be polled
	// together with ctx's end are not worth the descriptors.
	if !w.ticker && w.wake < 0 && len(w.tried) == 0 {
		if err := w.armWake(ctx); err != nil {
			w.ticker = true
		}
	}
	if !w.ticker && w.pinNew(live) {
		// A member died between alive() and pidfd_open: there is nothing
		// left to wait for on its account, so look again now.
		return
	}
	if !w.ticker && len(w.pins) == 0 {
		// Every live member has been tried and none could be pinned;
		// later rounds only see fewer members, so stop holding the
		// eventfd and tick.
		w.close()
		w.ticker = true
	}
	if w.ticker {
		sleep(ctx, limit)
		return
	}
	if err := w.poll(limit); err != nil {
		w.close()
		w.ticker = true
	}
}

// watching reports whether a pinned member has not exited yet (false
// too when ticking: there is nothing to wake on).
func (w *exitWatch) watching() bool { return !w.ticker && len(w.pins) > 0 }

// pinNew pins the live members not tried yet and reports whether one of
// them proved to have exited meanwhile. Each member is tried once: one
// that cannot be pinned now (EMFILE, ENOSYS, EPERM, unreadable /proc) is
// left to the ticker rather than retried on every round.
func (w *exitWatch) pinNew(live []fingerprint.Stat) (exited bool) {
	for _, m := range live {
		if len(w.pins) >= maxPins {
			// Trees are killed concurrently, and each needs a pidfd of
			// its own to be signalled at all: a huge group must not
			// take them all. The unpinned members only cost latency.
			break
		}
		id := identity{m.PID, m.StartTicks}
		if w.tried[id] {
			continue
		}
		w.tried[id] = true
		pin, err := fingerprint.Pin(w.root, m)
		if err != nil {
			exited = exited || notOccupying(err)
			continue
		}
		w.pins = append(w.pins, watched{id: id, pin: pin})
	}
	return exited
}

// poll blocks until a pinned member exits, ctx is done or limit passes.
// Pidfds that fired are closed and not watched again: a pidfd stays
// readable once its process has exited, and polling it again would spin.
func (w *exitWatch) poll(limit time.Duration) error {
	fds := make([]unix.PollFd, 0, len(w.pins)+1)
	fds = append(fds, unix.PollFd{Fd: int32(w.wake), Events: unix.POLLIN})
	for _, p := range w.pins {
		fds = append(fds, unix.PollFd{Fd: int32(p.pin.Fd()), Events: unix.POLLIN})
	}
	ts := unix.NsecToTimespec(limit.Nanoseconds())
	if _, err := unix.Ppoll(fds, &ts, nil); err != nil {
		if errors.Is(err, unix.EINTR) {
			return nil // a signal to this thread; the caller looks again
		}
		return fmt.Errorf("poll on %d pidfds: %w", len(w.pins), err)
	}
	kept := w.pins[:0]
	for i, p := range w.pins {
		if fds[i+1].Revents != 0 {
			// POLLIN: it exited. POLLERR/POLLNVAL: the pidfd is of no
			// more use. Either way alive() has the last word.
			p.pin.Close()
			continue
		}
		kept = append(kept, p)
	}
	clear(w.pins[len(kept):])
	w.pins = kept
	return nil
}

// armWake creates the eventfd that ctx's end writes to.
func (w *exitWatch) armWake(ctx context.Context) error {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	w.wake = fd
	done := make(chan struct{})
	w.wakeDone = done
	w.stopWake = context.AfterFunc(ctx, func() {
		defer close(done)
		one := [8]byte{1}
		_, _ = unix.Write(fd, one[:]) // cannot fail short of a full counter
	})
	return nil
}

// close releases every descriptor the watch holds.
func (w *exitWatch) close() {
	for _, p := range w.pins {
		p.pin.Close()
	}
	w.pins = nil
	if w.wake >= 0 {
		// The AfterFunc may be writing right now; closing first could
		// let it write into whatever file next gets this number.
		if !w.stopWake() {
			<-w.wakeDone
		}
		unix.Close(w.wake)
		w.wake = -1
	}
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
