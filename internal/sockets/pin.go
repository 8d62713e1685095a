package sockets

import (
	"fmt"
	"io/fs"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
)

// Pinned is a socket file held open (O_PATH) for connecting to it.
type Pinned struct {
	// Path reaches the held inode and nothing else (/proc/self/fd/N):
	// connect(2) through it looks no name up again. It is short, too:
	// sun_path holds 108 bytes.
	Path string
	// Stat is the socket's, read without asking any file system's server.
	Stat pathwalk.Stat
	fd   int // the descriptor + 1: the zero Pinned holds none
}

// Release closes the descriptor; Path reaches nothing after it. The zero
// Pinned holds nothing to release.
func (p Pinned) Release() {
	if p.fd > 0 {
		unix.Close(p.fd - 1)
	}
}

// Fstat re-reads the held socket file's stat: its change time moves when
// another of its names is unlinked.
func (p Pinned) Fstat() (pathwalk.Stat, error) {
	if p.fd <= 0 {
		return pathwalk.Stat{}, fmt.Errorf("nothing pinned: %w", fs.ErrInvalid)
	}
	return pathwalk.Fstat(p.fd - 1)
}

// PinAt opens name in the directory open as dirfd for connecting to it,
// if it is a socket of that directory's own mount. connect(2) by name
// would look the name up when it runs: a user may have replaced his
// socket by a mount of his FUSE file system meanwhile, and connect would
// then wait on its server, for ever if it never answers. The O_PATH open
// crosses into such a mount without asking the server; the check then
// refuses it (ErrChanged), and a name that is no socket (ErrNotSocket).
func PinAt(dirfd int, name string) (Pinned, error) {
	dir, err := pathwalk.Fstat(dirfd)
	if err != nil {
		return Pinned{}, err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Pinned{}, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	p := Pinned{Path: "/proc/self/fd/" + strconv.Itoa(fd), fd: fd + 1}
	p.Stat, err = pathwalk.Fstat(fd)
	switch {
	case !p.Stat.OnMount(dir.MountID):
		// Whatever the stat said: a mount of a user who allows no one
		// else refuses root's with EACCES.
		err = fmt.Errorf("%s: a mount point: %w", name, ErrChanged)
	case err != nil:
	case p.Stat.Mode&unix.S_IFMT != unix.S_IFSOCK:
		err = fmt.Errorf("%s (mode %#o): %w", name, p.Stat.Mode&unix.S_IFMT, ErrNotSocket)
	}
	if err != nil {
		p.Release()
		return Pinned{}, err
	}
	return p, nil
}
