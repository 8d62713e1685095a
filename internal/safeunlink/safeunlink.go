// Package safeunlink removes socket files without ever removing anything
// else: never through a symlink, never a file of another owner, never a
// file that was replaced since it was examined.
package safeunlink

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrRefused is returned (wrapped) when the file at the path is not the one
// that was examined, or not a socket of the expected owner.
var ErrRefused = errors.New("refusing to unlink")

// File identifies a socket file as it was examined.
type File struct {
	Dev, Ino uint64
	UID      int
	// Ctime is the inode change time; it approximates when the socket was
	// bound.
	CtimeSec, CtimeNsec int64
}

// Examine lstats path (never following a final symlink, and opening the
// parent directory without following one either) and returns its identity
// if it is a Unix socket.
func Examine(path string) (File, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	dfd, err := openDir(dir)
	if err != nil {
		return File{}, err
	}
	defer unix.Close(dfd)
	return examineAt(dfd, path, name)
}

func examineAt(dfd int, path, name string) (File, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return File{}, fmt.Errorf("%s is not a socket (mode %#o): %w", path, st.Mode&unix.S_IFMT, ErrRefused)
	}
	return File{Dev: st.Dev, Ino: st.Ino, UID: int(st.Uid), CtimeSec: st.Ctim.Sec, CtimeNsec: st.Ctim.Nsec}, nil
}

// openDir opens dir as an O_PATH directory descriptor. O_NOFOLLOW refuses a
// symlink in the last component; earlier components are the caller's
// configured socket directories.
func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", dir, err)
	}
	return fd, nil
}

// Unlink removes path only if it is still the socket described by want and
// owned by want.UID. The check and the unlink are made relative to one
// directory descriptor, so a directory swapped in between cannot redirect
// the unlink; the remaining window (a rename into place between fstatat and
// unlinkat) is a few microseconds wide and would need a process able to
// write the directory, which for the directories swept here is the
// socket's owner.
func Unlink(path string, want File) error {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%q has no file name: %w", path, ErrRefused)
	}
	dfd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	got, err := examineAt(dfd, path, name)
	if err != nil {
		return err
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fmt.Errorf("%s was replaced since it was examined: %w", path, ErrRefused)
	}
	if got.UID != want.UID {
		return fmt.Errorf("%s is owned by uid %d, expected %d: %w", path, got.UID, want.UID, ErrRefused)
	}
	if err := unix.Unlinkat(dfd, name, 0); err != nil {
		return fmt.Errorf("unlinking %s: %w", path, err)
	}
	return nil
}
