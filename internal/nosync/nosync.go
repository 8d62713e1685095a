// Package nosync stats files without waiting on their file system's
// server.
//
// lstat(2) of a file on FUSE may ask the file system's server for fresh
// attributes, and a user's server that never answers holds the caller in
// the system call for ever: no deadline ends it, and a path that named a
// socket when it was listed may have a FUSE mount over it by the time it
// is looked at. statx(2) with AT_STATX_DONT_SYNC answers from the
// attributes the kernel already holds (FUSE and NFS honour it; local file
// systems are always in sync), and its mount ID tells an entry of a
// directory from something mounted over that entry, without entering it.
package nosync

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// Stat is what lstat would say, with the mount the file is on.
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
func Lstat(dirfd int, name string) (Stat, error) {
	var x unix.Statx_t
	if err := unix.Statx(dirfd, name, flags|unix.AT_SYMLINK_NOFOLLOW, mask, &x); err != nil {
		return Stat{}, &fs.PathError{Op: "lstat", Path: name, Err: err}
	}
	return fromStatx(&x), nil
}

// Fstat stats the file open as fd (an O_PATH descriptor will do).
func Fstat(fd int) (Stat, error) {
	var x unix.Statx_t
	if err := unix.Statx(fd, "", flags|unix.AT_EMPTY_PATH, mask, &x); err != nil {
		return Stat{}, &fs.PathError{Op: "fstat", Path: "", Err: err}
	}
	return fromStatx(&x), nil
}

// OnMount says whether s is on the mount numbered id: false for a mount
// point over an entry of a directory on id. Without mount IDs it answers
// from the device, which misses a bind mount of the same file system.
func (s Stat) OnMount(id uint64, dev uint64) bool {
	if s.MountID != 0 && id != 0 {
		return s.MountID == id
	}
	return s.Dev == dev
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
