package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// MountTmpfs mounts a small tmpfs on a new directory name in dir,
// unmounted when the test ends (if it still is); it skips where it
// cannot.
func MountTmpfs(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	return p
}

// MountID is the ID of the mount p is on; it skips where the kernel
// reports none (before Linux 5.8).
func MountID(t testing.TB, p string) uint64 {
	t.Helper()
	var x unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &x)
	if err != nil || x.Mask&unix.STATX_MNT_ID == 0 {
		t.Skipf("no mount ID for %s (%v): Linux 5.8+", p, err)
	}
	return x.Mnt_id
}
