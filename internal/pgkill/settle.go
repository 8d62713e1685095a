package pgkill

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// settleWait bounds how long the search for joiners waits for recorded
// members that are zombies to be reaped by their parents.
const settleWait = 20 * time.Millisecond

// settle waits, briefly, until the recorded members that are still in the
// group as zombies have been reaped. Right after a tree dies its members
// are usually zombies for a moment, which keeps the group from looking
// empty; without this wait the empty-group check fails and the search of
// /proc (a system call per process on the host, tens of ms on a large
// one) runs for nothing. A pidfd polled for no event at all wakes only
// with POLLHUP, once its process is reaped. It only ever costs time: the
// caller still decides from the group itself.
func (k *killer) settle(known []fingerprint.Stat) {
	var fds []unix.PollFd
	defer func() {
		for _, f := range fds {
			unix.Close(int(f.Fd))
		}
	}()
	for _, m := range known {
		if len(fds) >= maxPins {
			break
		}
		st, err := fingerprint.Revalidate(k.opt.Root, m)
		if err != nil || st.PGID != k.pgid {
			continue // reaped already, or elsewhere
		}
		if !st.Zombie() {
			return // a recorded member lives: nothing to wait for here
		}
		fd, err := unix.PidfdOpen(m.PID, 0)
		if err != nil {
			continue
		}
		// Read after opening: the pidfd is the recorded zombie's only if
		// the PID still names it now (a zombie's PID is not reused until
		// it is reaped).
		if st, err := fingerprint.Revalidate(k.opt.Root, m); err != nil || !st.Zombie() {
			unix.Close(fd)
			continue
		}
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: 0})
	}
	deadline := time.Now().Add(settleWait)
	for pending := fds; len(pending) > 0; {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		n, err := unix.Ppoll(pending, &ts, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n == 0 && err == nil {
			return // the parents have not reaped them in time
		}
		waiting := pending[:0:0]
		for _, f := range pending {
			if f.Revents == 0 {
				waiting = append(waiting, f)
			}
		}
		pending = waiting
	}
}
