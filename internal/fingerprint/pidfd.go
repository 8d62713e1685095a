package fingerprint

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Pinned is a process held through a pidfd. Unlike a PID, a pidfd always
// refers to the process it was opened for: signals sent through it can
// never reach a process that later receives the same number.
type Pinned struct {
	Stat
	fd int
}

// ErrPidfdUnsupported is returned when the kernel lacks pidfd_open(2).
var ErrPidfdUnsupported = errors.New("pidfd_open not supported")

// Pin opens a pidfd for want.PID and then re-verifies the identity. The
// order matters: a PID recycled between an earlier read and pidfd_open
// would pin the wrong process, and only a read made after opening proves
// the pidfd refers to the recorded one. A thread ID fails with
// ErrNotProcess, a recycled PID with ErrRecycled, and a process that is
// gone or a zombie with ErrNotFound.
func Pin(root string, want Stat) (*Pinned, error) {
	fd, err := unix.PidfdOpen(want.PID, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ESRCH):
			return nil, fmt.Errorf("pid %d: %w", want.PID, ErrNotFound)
		case errors.Is(err, unix.ENOSYS):
			return nil, ErrPidfdUnsupported
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			// The number is a thread ID, not a thread-group leader:
			// EINVAL on older kernels, ENOENT on newer ones (seen on
			// 6.18). Either way nothing is pinned; /proc tells which.
			tgid, terr := readTGID(root, want.PID)
			switch {
			case terr == nil && tgid != want.PID:
				return nil, fmt.Errorf("pid %d (thread of %d): %w", want.PID, tgid, ErrNotProcess)
			case errors.Is(terr, ErrNotFound):
				return nil, fmt.Errorf("pid %d: %w", want.PID, ErrNotFound)
			}
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", want.PID, err)
	}
	st, err := Revalidate(root, want)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if st.Zombie() {
		// It has exited: there is nothing left to signal, and a pidfd
		// signal to a zombie "succeeds" without effect.
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d has exited (zombie): %w", want.PID, ErrNotFound)
	}
	return &Pinned{Stat: st, fd: fd}, nil
}

// Signal sends sig to the pinned process. ESRCH (it has exited) is
// reported as ErrNotFound.
func (p *Pinned) Signal(sig syscall.Signal) error {
	err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pid %d: %w", p.PID, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("signal %v to pid %d: %w", sig, p.PID, err)
	}
	return nil
}

// Fd returns the pidfd, for polling (it becomes readable when the process
// exits). It stays owned by p.
func (p *Pinned) Fd() int { return p.fd }

// Exited reports whether the pinned process has exited (its pidfd is
// readable). While it has not, its PID has named it all along: a PID is
// not reused before its process is reaped.
func (p *Pinned) Exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
}

// Close releases the pidfd.
func (p *Pinned) Close() error {
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}
