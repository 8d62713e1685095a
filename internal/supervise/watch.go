package supervise

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Watch methods, as logged.
const (
	WatchPidfd = "pidfd"
	WatchPoll  = "poll"
)

// watchInit returns a channel closed once the process init names (PID and
// start time) has died: exited, become a zombie, or (seen by polling) been
// replaced by another process under the same number. A pidfd is used when
// the kernel has pidfd_open; it refers to the process itself, so a recycled
// PID cannot fool it. Without pidfds the identity is polled every interval.
// It fails with ErrInitGone when init is already dead.
func watchInit(ctx context.Context, root string, init fingerprint.Stat, forcePoll bool, interval time.Duration) (<-chan struct{}, string, error) {
	dead := make(chan struct{})
	if !forcePoll {
		pin, err := fingerprint.Pin(root, init)
		switch {
		case err == nil:
			if pin.Zombie() {
				pin.Close()
				return nil, "", fmt.Errorf("%w: pid %d is a zombie", ErrInitGone, init.PID)
			}
			go func() {
				defer pin.Close()
				if !waitPidfd(ctx, pin.Fd()) {
					pollAlive(ctx, root, init, interval, dead)
				} else if ctx.Err() == nil {
					close(dead)
				}
			}()
			return dead, WatchPidfd, nil
		case errors.Is(err, fingerprint.ErrNotFound), errors.Is(err, fingerprint.ErrRecycled), errors.Is(err, fingerprint.ErrNotProcess):
			return nil, "", fmt.Errorf("%w: %v", ErrInitGone, err)
		default:
			// No pidfd support, or none to be had right now (EMFILE):
			// not proof that init is gone. Poll its identity instead.
		}
	}
	if gone(root, init) {
		return nil, "", fmt.Errorf("%w: pid %d with start time %d is not alive", ErrInitGone, init.PID, init.StartTicks)
	}
	go pollAlive(ctx, root, init, interval, dead)
	return dead, WatchPoll, nil
}

// gone reports whether init has died: its PID held by no process, by
// another, or by its zombie. A stat that cannot be read for another
// reason (EMFILE, ENOMEM under load) says nothing: taken for a death, it
// would have the container's supervisors killed while it runs.
func gone(root string, init fingerprint.Stat) bool {
	st, err := fingerprint.Revalidate(root, init)
	switch {
	case err == nil:
		return st.Zombie()
	case errors.Is(err, fingerprint.ErrNotFound), errors.Is(err, fingerprint.ErrRecycled), errors.Is(err, fingerprint.ErrNotProcess):
		return true
	}
	return false
}

// pollAlive closes dead once init is gone.
func pollAlive(ctx context.Context, root string, init fingerprint.Stat, interval time.Duration, dead chan<- struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if gone(root, init) {
			close(dead)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// waitPidfd waits until fd polls readable (the process has exited) and
// returns true, or returns true when ctx is done. It returns false if
// poll(2) fails on the pidfd, which should not happen; the caller then
// falls back to polling the identity rather than stop watching.
func waitPidfd(ctx context.Context, fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		n, err := unix.Poll(fds, 500)
		switch {
		case errors.Is(err, unix.EINTR), err == nil && n == 0:
			continue
		case err != nil, fds[0].Revents&unix.POLLNVAL != 0:
			return false
		}
		return true
	}
	return true
}
