package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// ErrApplyLocked is returned when another run held the apply lock for
// longer than the caller would wait.
var ErrApplyLocked = errors.New("another kc-janitor run is reaping (its apply lock is held)")

// ApplyLockName is the lock file, inside the state dir, that serialises
// runs that reap.
const ApplyLockName = "apply.lock"

// LockApply takes the lock that lets one run at a time decide and signal
// (DESIGN "One view of the host": two --apply runs never act at once). It lives in the state
// dir, which must be this UID's and closed to others: a lock another user
// could hold or swap would let them stop every reap, or worse. The state
// dir is created (0700) when missing; a state dir that cannot be written
// means the run could not record what it kills, so it must not kill: the
// error says why. It waits for a holder until ctx ends or wait passes.
func LockApply(ctx context.Context, stateDir string, wait time.Duration) (unlock func(), err error) {
	// As Open: nothing made, and no lock taken, through a directory above
	// that another user could change.
	if err := MakeStateDir(stateDir); err != nil {
		return nil, fmt.Errorf("state dir %s: cannot create it, so nothing can be recorded: %w", stateDir, err)
	}
	if err := checkParents(stateDir); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(stateDir, &st); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", stateDir, err)
	}
	euid := uint32(os.Geteuid())
	if err := trust.Stat(stateDir, &st, unix.S_IFDIR, false, euid); err != nil {
		return nil, fmt.Errorf("state dir: %w: it must be a directory (not a symlink) of this run's UID %d, mode 0700", err, euid)
	}
	path := filepath.Join(stateDir, ApplyLockName)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("apply lock %s: cannot open it, so nothing can be recorded: %w", path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != euid {
		unix.Close(fd)
		return nil, fmt.Errorf("apply lock %s is not a regular file of UID %d", path, euid)
	}
	deadline := time.Now().Add(wait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			unix.Close(fd)
			return nil, fmt.Errorf("apply lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			unix.Close(fd)
			return nil, fmt.Errorf("%w: waited %s", ErrApplyLocked, wait)
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, fmt.Errorf("%w: %w", ErrApplyLocked, ctx.Err())
		case <-time.After(pause):
		}
	}
}
