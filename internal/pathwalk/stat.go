package pathwalk

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// Stat is what lstat would say, with the mount the file is on; Nlink,
// Blksize and Blocks are not filled in.
type Stat struct {
	unix.Stat_t
	// MountID is the file's mount as mountinfo's first field numbers it;
	// 0 where the kernel does not say (before Linux 5.8).
	MountID uint64
}

const (
	mask  = unix.STATX_BASIC_STATS | unix.STATX_MNT_ID
	flags = unix.AT_STATX_DONT_SYNC | unix.AT_NO_AUTOMOUNT
)

// Lstat stats name relative to the directory open as dirfd, not following
// a final symlink. A name that is a mount point is answered for the root
// of what is mounted there, from cached attributes.
//
// A FUSE mount whose user did not allow others (the default) refuses
// root's stat with EACCES. The error is returned with what the kernel
// still tells without asking: the device and the mount ID (MountID 0
// where it does not), so that a caller can say it is a mount point.
func Lstat(dirfd int, name string) (Stat, error) {
	return statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, "lstat")
}

// Fstat stats the file open as fd (an O_PATH descriptor will do); errors
// as Lstat's.
func Fstat(fd int) (Stat, error) {
	return statx(fd, "", unix.AT_EMPTY_PATH, "fstat")
}

func statx(dirfd int, name string, at int, op string) (Stat, error) {
	var x unix.Statx_t
	err := unix.Statx(dirfd, name, flags|at, mask, &x)
	if err == nil {
		return fromStatx(&x), nil
	}
	var s Stat
	// FUSE answers a request for nothing (mask 0) with its device alone,
	// without asking its server; statx adds the mount ID.
	if err == unix.EACCES && unix.Statx(dirfd, name, flags|at, 0, &x) == nil {
		s.Dev = unix.Mkdev(x.Dev_major, x.Dev_minor)
		if x.Mask&unix.STATX_MNT_ID != 0 {
			s.MountID = x.Mnt_id
		}
	}
	return s, &fs.PathError{Op: op, Path: name, Err: err}
}

// OnMount says whether s is on the mount numbered id: false for a mount
// point over an entry of a directory on id. Where either mount ID is
// unknown (before Linux 5.8, or not stat'ed) it cannot tell and says
// true: devices would not do, as overlayfs shows a file's lower layer's.
func (s Stat) OnMount(id uint64) bool {
	return s.MountID == 0 || id == 0 || s.MountID == id
}

func fromStatx(x *unix.Statx_t) Stat {
	var s Stat
	s.Dev = unix.Mkdev(x.Dev_major, x.Dev_minor)
	s.Rdev = unix.Mkdev(x.Rdev_major, x.Rdev_minor)
	s.Ino = x.Ino
	s.Mode = uint32(x.Mode)
	s.Uid = x.Uid
	s.Gid = x.Gid
	s.Size = int64(x.Size)
	s.Atim = timespec(x.Atime)
	s.Mtim = timespec(x.Mtime)
	s.Ctim = timespec(x.Ctime)
	if x.Mask&unix.STATX_MNT_ID != 0 {
		s.MountID = x.Mnt_id
	}
	return s
}

// timespec converts through nanoseconds so that it compiles where
// Timespec's fields are 32 bits wide.
func timespec(t unix.StatxTimestamp) unix.Timespec {
	return unix.NsecToTimespec(t.Sec*1e9 + int64(t.Nsec))
}
