package pgkill

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Terminate sends SIGTERM to m alone, through a pidfd proven m's (PID and
// start time; never the caller), and waits up to wait for it to exit. A
// process that leads a group and takes it down by its own rules on
// SIGTERM (kc-hook's wrapper) is asked to, rather than its group killed
// from outside. gone says m has exited, or had before the signal.
func Terminate(root string, m fingerprint.Stat, wait time.Duration) (gone bool, err error) {
	if m.PID == os.Getpid() || m.PID <= 1 {
		return false, fmt.Errorf("pid %d is never signalled: %w", m.PID, errRefusedTarget)
	}
	pin, err := fingerprint.Pin(root, m)
	if err != nil {
		return true, nil // gone, or its PID another's: nothing of it left
	}
	defer pin.Close()
	if err := pin.Signal(syscall.SIGTERM); err != nil {
		return pin.Exited(), err
	}
	for end := time.Now().Add(wait); ; {
		left := time.Until(end)
		if left <= 0 {
			return pin.Exited(), nil
		}
		fds := []unix.PollFd{{Fd: int32(pin.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(min(left, time.Second).Milliseconds())+1); err == nil && n > 0 {
			return true, nil
		}
	}
}
