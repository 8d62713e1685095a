package contain

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxMountinfo bounds the read of the mount table: a host with a mount
// storm must not make every hook read megabytes.
const maxMountinfo = 1 << 20

type mount struct {
	root, point, fstype, super string
}

type mounts []mount

// readMounts reads <proc>/self/mountinfo, at most maxMountinfo bytes.
func readMounts(proc string) (mounts, error) {
	f, err := os.Open(filepath.Join(proc, "self", "mountinfo"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out mounts
	sc := bufio.NewScanner(io.LimitReader(f, maxMountinfo))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if !ok || len(a) < 5 || len(b) < 3 {
			continue
		}
		out = append(out, mount{root: a[3], point: unescape(a[4]), fstype: b[0], super: b[2]})
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}

// cgroup2 is the mount point of the cgroup v2 hierarchy at its root,
// verified with statfs; "" when there is none. /sys/fs/cgroup comes
// first, then a hybrid host's unified mount.
func (ms mounts) cgroup2() string {
	best := ""
	for _, m := range ms {
		if m.fstype != "cgroup2" || m.root != "/" || !isFS(m.point, unix.CGROUP2_SUPER_MAGIC) {
			continue
		}
		if best == "" || m.point == "/sys/fs/cgroup" {
			best = m.point
		}
	}
	return best
}

// freezer is the mount point of the v1 freezer hierarchy at its root.
func (ms mounts) freezer() string {
	for _, m := range ms {
		if m.fstype != "cgroup" || m.root != "/" || !isFS(m.point, unix.CGROUP_SUPER_MAGIC) {
			continue
		}
		for _, o := range strings.Split(m.super, ",") {
			if o == "freezer" {
				return m.point
			}
		}
	}
	return ""
}

// mountOf is the mount point kind's cgroups live in on this host.
func (ms mounts) mountOf(kind Kind) string {
	if kind == KindFreezer {
		return ms.freezer()
	}
	return ms.cgroup2()
}

func isFS(path string, magic int64) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && int64(st.Type) == magic
}

func magicOf(kind Kind) int64 {
	if kind == KindFreezer {
		return unix.CGROUP_SUPER_MAGIC
	}
	return unix.CGROUP2_SUPER_MAGIC
}

// errUnsafe: a cgroup path that is a symlink, not a directory, on the
// wrong filesystem or not owned by the caller.
var errUnsafe = errors.New("unsafe cgroup path")

// openMount opens a hierarchy's mount point and checks its filesystem.
func openMount(point string, kind Kind) (int, error) {
	fd, err := unix.Open(point, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: point, Err: err}
	}
	if err := checkFS(fd, point, kind); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func checkFS(fd int, name string, kind Kind) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return &os.PathError{Op: "statfs", Path: name, Err: err}
	}
	if int64(st.Type) != magicOf(kind) {
		return fmt.Errorf("%s is not a %s hierarchy (filesystem type %#x): %w", name, kind, st.Type, errUnsafe)
	}
	return nil
}

// openDirAt opens the directory name below dirfd without following a
// symlink, on the hierarchy's filesystem, owned by euid.
func openDirAt(dirfd int, name string, kind Kind) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s is a symlink or not a directory: %w", name, errUnsafe)
		}
		return -1, &os.PathError{Op: "open", Path: name, Err: err}
	}
	if err := checkFS(fd, name, kind); err != nil {
		unix.Close(fd)
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is owned by uid %d, not %d: %w", name, st.Uid, os.Geteuid(), errUnsafe)
	}
	return fd, nil
}

// openPath opens rel (clean, relative, no "..") below the mount fd one
// component at a time, none a symlink.
func openPath(mountFD int, rel string, kind Kind) (int, error) {
	fd, err := unix.Dup(mountFD)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		next, err := openDirAt(fd, c, kind)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// readAt reads a small cgroup file below dirfd.
func readAt(dirfd int, name string) ([]byte, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

// writeAt writes a cgroup control file below dirfd.
func writeAt(dirfd int, name, value string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return &os.PathError{Op: "write", Path: name, Err: err}
	}
	return nil
}
