package pathwalk

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	// maxLinks is how many symlinks one walk follows, as the kernel's
	// MAXSYMLINKS.
	maxLinks = 40
	// maxDepth bounds the descriptors a walk holds, one per directory
	// deep: a process names its socket directory as it likes.
	maxDepth = 256
)

// Walk resolves a path one component at a time, each opened O_PATH
// relative to the one before and judged by its mount before anything in
// it is looked up. open(2) of the whole path would look each name up in
// the directory before it, and a lookup in a user's FUSE directory waits
// on his server, for ever if it never answers: a mount he put on any
// component after the guard's table was read would hold the caller. The
// guard's table shows only the mounts made before.
type Walk struct {
	Guard Guard
	// InRoot: the base is a container's root, and the path stays in it
	// as openat2's RESOLVE_IN_ROOT keeps it: ".." at the root and
	// absolute symlinks lead back to it; a magic link is refused.
	InRoot bool
	// Follow: symlinks before the last component are followed (a
	// directory the operator named may be reached through his own).
	// Without it a symlink anywhere is refused: directories a process
	// named are not followed through symlinks.
	Follow bool
	// FollowLast: a symlink as the last component is followed too; else
	// it is refused with ENOTDIR, as an O_PATH|O_NOFOLLOW|O_DIRECTORY
	// open refuses it.
	FollowLast bool
	// Prefix is put before the walked path in errors (the container's
	// root as the host sees it).
	Prefix string
	// Through, when set, is asked before a name is looked up in a
	// directory (its path as shown, its stat): an error stops the walk
	// there (a directory the process a path came from could not search).
	Through func(shown string, st Stat) error
}

var (
	// ErrSymlink marks a symlink a walk without follow met.
	ErrSymlink = errors.New("is a symlink, and directories named by a process are not followed through symlinks")
	// ErrProcLinkInRoot marks a /proc link met inside a container's
	// root: it would lead out of it.
	ErrProcLinkInRoot = errors.New("a /proc link, not followed inside a container's root")
	// ErrReplacedOnTheWay marks a symlink replaced between its look and
	// its read.
	ErrReplacedOnTheWay = errors.New("replaced while the path was walked")
)

// Open returns an O_PATH descriptor of the directory inner names,
// relative to base (an O_PATH descriptor of "/" or of a container's root,
// left open). Its errors are an errno, the guard's refusal or a symlink
// refused, each naming the component where the walk stopped.
func (w Walk) Open(base int, inner string) (int, error) {
	type step struct {
		fd   int
		path string
	}
	// The base is judged too: a container's root may be a user's FUSE
	// mount, and the first lookup would be in it.
	first, err := w.openJudged(base, "", w.Prefix+"/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return -1, err
	}
	stack := []step{{first, ""}}
	defer func() {
		for _, s := range stack {
			unix.Close(s.fd)
		}
	}()
	back := func(n int) {
		for len(stack) > n {
			unix.Close(stack[len(stack)-1].fd)
			stack = stack[:len(stack)-1]
		}
	}
	todo := strings.Split(inner, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			// The parent is the directory the walk came from: every
			// step was opened in the one before, symlinks spliced.
			if len(stack) > 1 {
				back(len(stack) - 1)
			}
			continue
		}
		top := stack[len(stack)-1]
		at := top.path + "/" + c
		shown := w.Prefix + at
		last := !slices.ContainsFunc(todo, func(s string) bool { return s != "" && s != "." })
		if w.Through != nil {
			dst, err := Fstat(top.fd)
			if err != nil {
				return -1, &fs.PathError{Op: "fstat", Path: w.Prefix + top.path + "/", Err: errnoOf(err)}
			}
			if err := w.Through(w.Prefix+top.path+"/", dst); err != nil {
				return -1, err
			}
		}
		st, err := Lstat(top.fd, c)
		// The mount before the stat's error: a FUSE mount of a user who
		// allows no one else refuses root's stat (EACCES), and is his.
		if merr := w.Guard.Mount(shown, st.MountID); merr != nil {
			return -1, merr
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: shown, Err: errnoOf(err)}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			switch {
			case !w.Follow:
				return -1, fmt.Errorf("%s %w", shown, ErrSymlink)
			case last && !w.FollowLast:
				return -1, &fs.PathError{Op: "open", Path: shown, Err: unix.ENOTDIR}
			}
			if links++; links > maxLinks {
				return -1, &fs.PathError{Op: "open", Path: shown, Err: unix.ELOOP}
			}
			proc, err := onProcfs(top.fd)
			if err != nil {
				return -1, &fs.PathError{Op: "statfs", Path: w.Prefix + top.path, Err: err}
			}
			if proc {
				// /proc/<pid>/root and its kind name no path to
				// splice: the kernel jumps to what they hold, looking
				// nothing up on the way, and the mount is judged on
				// arrival.
				if w.InRoot {
					return -1, fmt.Errorf("%s: %w", shown, ErrProcLinkInRoot)
				}
				if len(stack) > maxDepth {
					return -1, &fs.PathError{Op: "open", Path: shown, Err: unix.ENAMETOOLONG}
				}
				next, err := w.openJudged(top.fd, c, shown, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
				if err != nil {
					return -1, err
				}
				stack = append(stack, step{next, at})
				continue
			}
			target, err := w.readlink(top.fd, c, shown)
			if err != nil {
				return -1, err
			}
			if strings.HasPrefix(target, "/") {
				back(1)
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		if len(stack) > maxDepth {
			return -1, &fs.PathError{Op: "open", Path: shown, Err: unix.ENAMETOOLONG}
		}
		next, err := w.openJudged(top.fd, c, shown, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if err != nil {
			return -1, err
		}
		stack = append(stack, step{next, at})
	}
	top := stack[len(stack)-1]
	stack = stack[:len(stack)-1] // the caller's now
	return top.fd, nil
}

// OpenFrom is Open from the directory base (an absolute path, opened
// here and closed before it returns).
func (w Walk) OpenFrom(base, inner string) (int, error) {
	bfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: base, Err: err}
	}
	defer unix.Close(bfd)
	return w.Open(bfd, inner)
}

// openJudged opens c in the directory open as fd ("": that directory
// again) and judges what was opened by its mount: a mount put over c
// since it was looked at is what the descriptor holds.
func (w Walk) openJudged(fd int, c, shown string, flags int) (int, error) {
	if c == "" {
		c, flags = ".", flags&^unix.O_NOFOLLOW
	}
	next, err := unix.Openat(fd, c, flags, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: shown, Err: err}
	}
	st, err := Fstat(next)
	if merr := w.Guard.Mount(shown, st.MountID); merr != nil {
		unix.Close(next)
		return -1, merr
	}
	if err != nil {
		unix.Close(next)
		return -1, &fs.PathError{Op: "fstat", Path: shown, Err: errnoOf(err)}
	}
	return next, nil
}

// readlink reads the symlink c in the directory open as fd, held while it
// is judged: what is mounted over c since it was looked at is what the
// descriptor holds, and a read of it asks no server.
func (w Walk) readlink(fd int, c, shown string) (string, error) {
	lfd, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: shown, Err: err}
	}
	defer unix.Close(lfd)
	st, err := Fstat(lfd)
	if merr := w.Guard.Mount(shown, st.MountID); merr != nil {
		return "", merr
	}
	if err != nil {
		return "", &fs.PathError{Op: "fstat", Path: shown, Err: errnoOf(err)}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return "", fmt.Errorf("%s: %w", shown, ErrReplacedOnTheWay)
	}
	target, err := readlinkat(lfd, "")
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: shown, Err: err}
	}
	return target, nil
}

// onProcfs says whether the directory open as fd is on a procfs, where
// symlinks are the kernel's own.
func onProcfs(fd int) (bool, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return false, err
	}
	return sfs.Type == unix.PROC_SUPER_MAGIC, nil
}

func readlinkat(fd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", err
	}
	if n == len(buf) {
		return "", unix.ENAMETOOLONG
	}
	return string(buf[:n]), nil
}

// errnoOf is the errno under a Stat error, or the error itself.
func errnoOf(err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}
