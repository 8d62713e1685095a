// Package trust says whether a file could have been written or swapped
// by a user this run does not trust. Ask it before root runs, reads as
// configuration, or locks a file that another user may be able to reach.
package trust

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUntrusted matches every *Error.
var ErrUntrusted = errors.New("untrusted")

// Error says why someone other than the trusted owners could write or
// swap the file at Path.
type Error struct {
	Path, Why string
}

func (e *Error) Error() string { return e.Path + " " + e.Why }

func (e *Error) Is(target error) bool { return target == ErrUntrusted }

func untrusted(path, format string, a ...any) error {
	return &Error{Path: path, Why: fmt.Sprintf(format, a...)}
}

// maxLinks is the kernel's own limit on symlinks followed in one lookup.
const maxLinks = 40

// Stat says why the file st describes is not of the given kind (unix.S_IFREG
// or unix.S_IFDIR), not owned by one of owners, or writable by group or
// others. A directory others may write is accepted when sticky and sticky
// is true (/tmp: nobody else may rename or remove what is ours there).
func Stat(path string, st *unix.Stat_t, kind uint32, sticky bool, owners ...uint32) error {
	switch got := st.Mode & unix.S_IFMT; {
	case got == kind:
	case got == unix.S_IFLNK:
		return untrusted(path, "is a symlink")
	case kind == unix.S_IFDIR:
		return untrusted(path, "is not a directory")
	default:
		return untrusted(path, "is not a regular file")
	}
	if !slices.Contains(owners, st.Uid) {
		return untrusted(path, "is owned by UID %d", st.Uid)
	}
	if st.Mode&0o022 != 0 && !(sticky && kind == unix.S_IFDIR && st.Mode&unix.S_ISVTX != 0) {
		return untrusted(path, "is writable by group or others (mode %04o)", st.Mode&0o7777)
	}
	return nil
}

// Path resolves path one name at a time, as the kernel does, and checks
// every directory it passes through and the file it ends at with Stat
// (sticky directories accepted). A symlink is followed when a trusted
// owner's: its own directory is one of those checked, so no one else can
// change where it points. It
// returns the path resolved. ".." is taken from where the walk stands,
// as the kernel takes it, not from the path's text. Links in /proc, whose
// targets are not where their text says, are refused, as is a file with
// other hard links in a directory others may write.
func Path(path string, kind uint32, owners ...uint32) (resolved string, err error) {
	if !filepath.IsAbs(path) {
		return "", untrusted(path, "is not an absolute path")
	}
	if err := lstat("/", unix.S_IFDIR, owners); err != nil {
		return "", err
	}
	cur, rest, links := "/", names(path), 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			// Every directory on the way was entered from its parent,
			// which was checked before it.
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		var st unix.Stat_t
		if err := unix.Lstat(next, &st); err != nil {
			return "", fmt.Errorf("%s: %w", next, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			// In a sticky directory others may write, a link is its
			// owner's to remove and plant again.
			if !slices.Contains(owners, st.Uid) {
				return "", untrusted(next, "is a symlink owned by UID %d", st.Uid)
			}
			var fs unix.Statfs_t
			if err := unix.Statfs(cur, &fs); err != nil {
				return "", fmt.Errorf("%s: %w", cur, err)
			}
			if fs.Type == unix.PROC_SUPER_MAGIC {
				return "", untrusted(next, "is a link in /proc")
			}
			if links++; links > maxLinks {
				return "", fmt.Errorf("%s: %w", path, unix.ELOOP)
			}
			target, err := readlink(next)
			if err != nil {
				return "", err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			rest = append(names(target), rest...)
			continue
		}
		want := uint32(unix.S_IFDIR)
		if len(rest) == 0 {
			want = kind
		}
		if err := Stat(next, &st, want, true, owners...); err != nil {
			return "", err
		}
		// Anyone may link a file of ours into a dir he may write (unless
		// fs.protected_hardlinks): the name there is not ours.
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
			var dir unix.Stat_t
			if err := unix.Stat(cur, &dir); err != nil {
				return "", fmt.Errorf("%s: %w", cur, err)
			}
			if dir.Mode&0o022 != 0 {
				return "", untrusted(next, "has %d hard links and is in %s, which others may write", st.Nlink, cur)
			}
		}
		cur = next
	}
	// Again with kind: the walk may have ended on "..", or on "/".
	if err := lstat(cur, kind, owners); err != nil {
		return "", err
	}
	return cur, nil
}

func lstat(path string, kind uint32, owners []uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return Stat(path, &st, kind, true, owners...)
}

func names(p string) []string {
	return strings.Split(strings.Trim(p, "/"), "/")
}

func readlink(path string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlink(path, buf)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if n == len(buf) {
		return "", fmt.Errorf("%s: %w", path, unix.ENAMETOOLONG)
	}
	return string(buf[:n]), nil
}
