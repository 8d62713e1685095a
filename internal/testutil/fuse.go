package testutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// MountFUSE mounts a FUSE file system that no process serves over the
// directory dir/name (made if missing), owned by Nobody, as a user's sshfs
// or rclone mount is, and returns its path. opts are more mount options: without
// allow_other root's accesses fail with EACCES; with it, an access that
// asks the server waits, for ever, until the test ends (closing
// /dev/fuse aborts the connection), and default_permissions makes even a
// permission check ask it. Skips where FUSE is missing.
func MountFUSE(t testing.TB, dir, name, opts string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Fatal(err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	all := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d", fd, Nobody, Nobody)
	if opts != "" {
		all += "," + opts
	}
	if err := unix.Mount("kc-test", p, "fuse", unix.MS_NOSUID|unix.MS_NODEV, all); err != nil {
		t.Skipf("cannot mount FUSE here: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", p, err)
		}
	})
	return p
}

// Within runs f and returns what it returns, failing t if f has not
// returned after d: a call held by an unserved FUSE mount never returns,
// and the test must say so rather than hang. f runs on in the background
// past a failure; it must not use t.
func Within[T any](t testing.TB, d time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1) // buffered: f returning after the test must not block
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
	}
	panic("unreachable")
}
