// Package pathwalk reaches files for root without ever waiting on a
// user's file system server. A FUSE server that never answers holds a
// process in the system call for ever (no deadline ends it), and any user
// may mount one, with allow_other, on a path root is about to use.
//
// Lstat and Fstat ask no server: statx(2) with AT_STATX_DONT_SYNC answers
// from the attributes the kernel already holds (FUSE and NFS honour it;
// local file systems are always in sync), and its mount ID tells an entry
// of a directory from something mounted over it, without entering it.
//
// Walk opens a directory by path one component at a time, each opened
// O_PATH relative to the one before and judged by its mount (Guard)
// before anything in it is looked up; symlinks are followed or refused as
// the caller asks, and a container's paths stay inside its root.
package pathwalk
