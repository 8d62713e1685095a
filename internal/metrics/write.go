package metrics

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/atomicfile"
)

// LockTimeout bounds the wait for another janitor's write of the same
// file. A write takes milliseconds; a holder that keeps the lock longer is
// stopped or stuck, and waiting on it would hang the oneshot unit, the
// watch loop and every cron run behind it.
const LockTimeout = 5 * time.Second

// ErrLocked is returned (wrapped) when the lock could not be had in time;
// the file is then left as it was.
var ErrLocked = errors.New("metrics file locked by another process")

// maxOld bounds what is read of the existing file: a textfile of the
// janitor's own is a few KiB, anything far larger is not ours to merge.
const maxOld = 4 << 20

// WriteFile is WriteFileWait with LockTimeout.
func WriteFile(path string, s *Set) error { return WriteFileWait(path, s, LockTimeout) }

// WriteFileWait merges s into the exposition at path (creating it if
// needed) and replaces the file atomically, mode 0644. An existing file
// that cannot be parsed, or is not a regular file, is replaced by s's
// series alone. When another writer holds the lock for longer than wait,
// nothing is written and the error wraps ErrLocked.
func WriteFileWait(path string, s *Set, wait time.Duration) error {
	if s.Empty() {
		return nil
	}
	dir := filepath.Dir(path)
	unlock, err := lock(filepath.Join(dir, "."+filepath.Base(path)+".lock"), wait)
	if err != nil {
		return err
	}
	defer unlock()

	fresh, err := s.Gather()
	if err != nil {
		return fmt.Errorf("gathering metrics: %w", err)
	}
	old, err := readOld(path)
	if err != nil {
		return err
	}
	for _, n := range s.drop {
		delete(old, n)
	}
	out, err := Encode(Merge(old, fresh))
	if err != nil {
		return err
	}
	return replace(dir, path, out)
}

// lock takes an exclusive flock on lockPath, a file only this UID can open.
// The directory itself is not locked: flock needs only a descriptor, and
// any user who can read the directory could hold that lock forever. The
// file is opened without following a symlink and refused unless it is a
// regular file of ours that nobody else can open (created 0600; a looser
// one was not made by us, and its opener may still hold it).
func lock(lockPath string, wait time.Duration) (func(), error) {
	fd, err := unix.Open(lockPath, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening metrics lock %s (a symlink there is refused): %w", lockPath, err)
	}
	f := os.NewFile(uintptr(fd), lockPath)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("metrics lock %s: %w", lockPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("metrics lock %s is not a private file of UID %d (owner %d, mode %#o): remove it", lockPath, os.Geteuid(), st.Uid, st.Mode)
	}
	deadline := time.Now().Add(wait)
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the flock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking metrics file: %w", err)
		}
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, fmt.Errorf("%s held for %v, metrics not written: %w", lockPath, wait, ErrLocked)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readOld returns the series already in path. Nothing is followed or
// waited on: a symlink, FIFO or device planted there is not read (the
// rename replaces it), so it can neither hang the run nor copy another
// file's contents into a world-readable one.
func readOld(path string) (map[string]*dto.MetricFamily, error) {
	old := map[string]*dto.MetricFamily{}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP):
		return old, nil
	case err != nil:
		return nil, fmt.Errorf("reading metrics file: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxOld {
		return old, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, maxOld))
	if err != nil {
		return nil, fmt.Errorf("reading metrics file: %w", err)
	}
	if parsed, perr := Parse(data); perr == nil {
		old = parsed
	}
	return old, nil
}

// replace writes data to a new file in dir and renames it over path
// (atomicfile.Write), mode 0644: node_exporter runs as its own user. The
// collector reads only *.prom files: the temporary dot-name without that
// suffix is never picked up half-written.
func replace(dir, path string, data []byte) error {
	return atomicfile.Write(dir, "."+filepath.Base(path)+".tmp-*", path, data, 0o644, "metrics file")
}
