package contain

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
)

type mounts []mountinfo.Mount

// MountTable is the cgroup mounts of the mount table, read once for the
// cgroups of one decision (Options.Mounts): a burst of a hundred deaths'
// sweeps would otherwise read a node's whole table once each. Where the
// hierarchies are mounted does not change under a running host; a
// cgroup not found where the table said is an error, as any.
type MountTable struct {
	once sync.Once
	ms   mounts
	err  error
	// reads counts the table's reads, for tests.
	reads int
}

// NewMountTable returns a table read at its first use.
func NewMountTable() *MountTable { return &MountTable{} }

// mountsOf reads the cgroup mounts: opt.Mounts' where set.
func mountsOf(opt Options) (mounts, error) {
	if opt.Mounts == nil {
		return readMounts(opt.Proc)
	}
	t := opt.Mounts
	t.once.Do(func() {
		t.ms, t.err = readMounts(opt.Proc)
		t.reads++
	})
	return t.ms, t.err
}

// readMounts reads <proc>/self/mountinfo, at most mountinfo.Max bytes
// where they hold a cgroup mount: a host with a mount storm must not make
// every hook read megabytes, and the cgroup mounts come early. Past the
// bound the table is used as far as it was read.
func readMounts(proc string) (mounts, error) {
	ms, err := mountinfo.ReadFor(filepath.Join(proc, "self", "mountinfo"), func(m mountinfo.Mount) bool {
		return m.FSType == "cgroup2" || m.FSType == "cgroup"
	})
	if errors.Is(err, mountinfo.ErrTruncated) {
		err = nil
	}
	return ms, err
}

// cgroup2 is the mount point of the cgroup v2 hierarchy at its root,
// verified with statfs; "" when there is none. /sys/fs/cgroup comes
// first, then a hybrid host's unified mount.
func (ms mounts) cgroup2() string {
	best := ""
	for _, m := range ms {
		if m.FSType != "cgroup2" || m.Root != "/" || !isFS(m.Point, unix.CGROUP2_SUPER_MAGIC) {
			continue
		}
		if best == "" || m.Point == "/sys/fs/cgroup" {
			best = m.Point
		}
	}
	return best
}

// freezer is the mount point of the v1 freezer hierarchy at its root.
func (ms mounts) freezer() string {
	for _, m := range ms {
		if m.FSType != "cgroup" || m.Root != "/" || !isFS(m.Point, unix.CGROUP_SUPER_MAGIC) {
			continue
		}
		for _, o := range strings.Split(m.Super, ",") {
			if o == "freezer" {
				return m.Point
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
