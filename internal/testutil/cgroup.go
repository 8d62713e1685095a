package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup is a cgroup v2 directory a test made.
type Cgroup struct {
	// Dir is its directory under the cgroup2 mount.
	Dir string
	// Path is its path as /proc/<pid>/cgroup shows it ("/kc-test-…/…").
	Path string
}

// MakeCgroup makes a cgroup v2 directory named by rel (nested) under a
// test-owned "kc-test-<random>" directory of the host's cgroup2 mount
// (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid layout), and
// removes both once the test's processes have left them. The test is
// skipped where no cgroup2 mount is writable.
func MakeCgroup(t testing.TB, rel ...string) Cgroup {
	t.Helper()
	mount := ""
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var fs unix.Statfs_t
		if unix.Statfs(m, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
			mount = m
			break
		}
	}
	if mount == "" {
		t.Skip("no cgroup2 mount")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	top := "kc-test-" + hex.EncodeToString(b)
	path := "/" + filepath.Join(append([]string{top}, rel...)...)
	dir := filepath.Join(mount, path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			t.Skipf("cannot make a cgroup under %s: %v", mount, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bottom-up; a cgroup is removable once its last process has
		// exited, which the processes' own cleanup only started.
		for d := dir; ; d = filepath.Dir(d) {
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := unix.Rmdir(d)
				if err == nil || errors.Is(err, unix.ENOENT) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("removing test cgroup %s: %v", d, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			if strings.HasSuffix(d, "/"+top) {
				return
			}
		}
	})
	return Cgroup{Dir: dir, Path: path}
}
