package sockets

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
)

// FileID is what a socket file was when it was classified.
type FileID struct {
	Dev, Ino uint64
	UID      int
}

var (
	// ErrChanged is returned (wrapped) by UnlinkAt when the entry is no
	// longer the socket that was classified: another file type, another
	// inode or another owner. Nothing is unlinked.
	ErrChanged = errors.New("changed since it was classified")
	// ErrGone is returned (wrapped) by UnlinkAt when the entry no longer
	// exists.
	ErrGone = errors.New("no longer exists")
	// ErrBadName is returned (wrapped) by UnlinkAt for a name that is not
	// a supervisor socket name (see ParseName).
	ErrBadName = errors.New("not a supervisor socket name")
)

// UnlinkAt removes name from the directory open as dirfd, but only if,
// checked immediately before the unlink, the entry (not following
// symlinks) is a socket with want's device, inode and owner. The check and
// the unlink are both relative to dirfd, so neither a symlinked path
// component nor a renamed directory can redirect them. A window of a few
// system calls remains between the check and unlinkat(2); the inode check
// narrows it to an entry being replaced in that window, which needs write
// access to the directory (and, in a sticky directory, its own file).
func UnlinkAt(dirfd int, name string, want FileID) error {
	if _, ok := ParseName(name); !ok {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s: %w", name, ErrGone)
		}
		return &fs.PathError{Op: "lstat", Path: name, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		return fmt.Errorf("%s: now a %s: %w", name, fileType(st.Mode&unix.S_IFMT), ErrChanged)
	case st.Dev != want.Dev || st.Ino != want.Ino:
		return fmt.Errorf("%s: now inode %d:%d, classified %d:%d: %w", name, st.Dev, st.Ino, want.Dev, want.Ino, ErrChanged)
	case int(st.Uid) != want.UID:
		return fmt.Errorf("%s: now owned by uid %d, classified %d: %w", name, st.Uid, want.UID, ErrChanged)
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s: %w", name, ErrGone)
		}
		return &fs.PathError{Op: "unlink", Path: name, Err: err}
	}
	return nil
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
