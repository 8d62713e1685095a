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
// the pidfd refers to the recorded one.
func Pin(root string, want Stat) (*Pinned, error) {
	fd, err := unix.PidfdOpen(want.PID, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ESRCH):
			return nil, fmt.Errorf("pid %d: %w", want.PID, ErrNotFound)
		case errors.Is(err, unix.ENOSYS):
			return nil, ErrPidfdUnsupported
		case errors.Is(err, unix.EINVAL):
			// EINVAL: the number is a thread ID, not a thread-group leader.
			return nil, fmt.Errorf("pid %d: %w", want.PID, ErrNotProcess)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", want.PID, err)
	}
	st, err := Revalidate(root, want)
	if err != nil {
		unix.Close(fd)
		return nil, err
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

// Close releases the pidfd.
func (p *Pinned) Close() error {
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}
