package sockets

// The one unlink primitive of kc-watchman (the hook, reconcile and sweep
// all go through it): it removes socket files without ever removing
// anything else: never through a symlink, never a file of another owner,
// never a file that was replaced since it was examined.

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
)

var (
	// ErrNotSocket is returned (wrapped) for anything but a Unix socket
	// where one was to be examined or dialled: a symlink, a regular file,
	// a FIFO, a directory.
	ErrNotSocket = errors.New("not a socket")
	// ErrChanged is returned (wrapped) when the entry is no longer the
	// socket that was examined: another file type, another inode or another
	// owner. Nothing is unlinked.
	ErrChanged = errors.New("changed since it was examined")
	// ErrGone is returned (wrapped) when the entry no longer exists.
	ErrGone = errors.New("no longer exists")
)

// File identifies a socket file as it was examined.
type File struct {
	Dev, Ino uint64
	UID      int
	// Ctime is the inode change time, which approximates when the socket
	// was bound.
	CtimeSec, CtimeNsec int64
}

// Examine lstats path, a clean absolute path a process bound (never
// following a final symlink; see within for how it is reached), and
// returns its identity if it is a Unix socket.
func Examine(path string) (File, error) {
	var r reach
	defer r.close()
	return r.examine(path)
}

func (r *reach) examine(path string) (File, error) {
	var f File
	err := r.within(path, func(dfd int, name string) error {
		st, err := lstatAt(dfd, name)
		if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return fmt.Errorf("mode %#o: %w", st.Mode&unix.S_IFMT, ErrNotSocket)
		}
		f = File{Dev: st.Dev, Ino: st.Ino, UID: int(st.Uid), CtimeSec: st.Ctim.Sec, CtimeNsec: st.Ctim.Nsec}
		return nil
	})
	return f, err
}

// Unlink removes path, reached as Examine reaches it, only if it is still
// the socket described by want. See unlinkAt.
func Unlink(path string, want File) error {
	var r reach
	defer r.close()
	return r.within(path, func(dfd int, name string) error { return unlinkAt(dfd, name, want) })
}

// unlinkAt removes name from the directory open as dirfd, but only if,
// checked immediately before the unlink, the entry (not following
// symlinks) is a socket with want's device, inode, owner and, when want
// has one, change time. The check and
// the unlink are both relative to dirfd, so neither a symlinked path
// component nor a renamed directory can redirect them. A window of a few
// system calls remains between the check and unlinkat(2); the inode check
// narrows it to an entry being replaced in that window, which needs write
// access to the directory (and, in a sticky directory, its own file).
func unlinkAt(dirfd int, name string, want File) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("%q is not a file name: %w", name, ErrChanged)
	}
	st, err := lstatAt(dirfd, name)
	if err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		return fmt.Errorf("%s: now mode %#o: %w", name, st.Mode&unix.S_IFMT, ErrChanged)
	case st.Dev != want.Dev || st.Ino != want.Ino:
		return fmt.Errorf("%s: now inode %d:%d, examined %d:%d: %w", name, st.Dev, st.Ino, want.Dev, want.Ino, ErrChanged)
	case int(st.Uid) != want.UID:
		return fmt.Errorf("%s: now owned by uid %d, examined %d: %w", name, st.Uid, want.UID, ErrChanged)
	case want.CtimeSec != 0 && (st.Ctim.Sec != want.CtimeSec || st.Ctim.Nsec != want.CtimeNsec):
		// A socket unlinked and bound again can get the same inode number
		// at once (tmpfs does this); its change time tells them apart.
		return fmt.Errorf("%s: inode changed at %d.%09d, examined at %d.%09d: %w", name, st.Ctim.Sec, st.Ctim.Nsec, want.CtimeSec, want.CtimeNsec, ErrChanged)
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s: %w", name, ErrGone)
		}
		return &fs.PathError{Op: "unlink", Path: name, Err: err}
	}
	return nil
}

// lstatAt never waits on a FUSE server: the name may have had a user's
// mount put over it since it was examined (pathwalk.Lstat).
func lstatAt(dirfd int, name string) (unix.Stat_t, error) {
	st, err := pathwalk.Lstat(dirfd, name)
	if errors.Is(err, unix.ENOENT) {
		return st.Stat_t, fmt.Errorf("%s: %w", name, ErrGone)
	}
	return st.Stat_t, err
}

// reach walks to the directories of sockets processes bound, judging
// them by one read of the mount table, read at first use (a tree with no
// socket costs none). Not safe for concurrent use; close releases it.
type reach struct {
	g    pathwalk.Guard
	read bool
}

func (r *reach) close() {
	if r.read {
		r.g.Close()
	}
}

// within calls f with the directory of path, a clean absolute path a
// process bound a socket to, open O_PATH, and the last component; f's
// error is returned with path put before it. The directory is walked to a
// component at a time (pathwalk), judged by the mount table of the
// caller's namespace: no symlink is followed anywhere on the way, as
// whoever can change one could redirect an unlink between the
// examination and the act; and no user's FUSE mount is entered, as a
// lookup in one waits on his server, for ever if it never answers, and a
// container's stop waits on the hook.
func (r *reach) within(path string, f func(dfd int, name string) error) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return fmt.Errorf("%q: not a clean absolute path to a file", path)
	}
	dir, name := filepath.Split(path)
	if !r.read {
		r.g, r.read = pathwalk.ReadGuard("/proc", 0), true
	}
	if err := r.g.Refuse(dir); err != nil {
		return err
	}
	dfd, err := pathwalk.Walk{Guard: r.g}.OpenFrom("/", dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := f(dfd, name); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
