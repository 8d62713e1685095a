package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
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

// RemoveContainCgroups kills whatever is left in the cgroups kc-hook
// supervise made for containerID (<mount>/kc-watchman/<id> on the cgroup2
// mount and the v1 freezer) and removes them, and kc-watchman/ itself
// when it is empty: a test that SIGKILLed its wrapper leaves them
// behind. Errors are the test's.
func RemoveContainCgroups(t testing.TB, containerID string) {
	t.Helper()
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"} {
		dir := filepath.Join(m, "kc-watchman", containerID)
		if _, err := os.Lstat(dir); err != nil {
			unix.Rmdir(filepath.Dir(dir)) //nolint:errcheck // absent, or in use by another container's
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
			// v1 freezer, or a kernel without cgroup.kill: each process.
			os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0) //nolint:errcheck // v1 only
			if data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
						unix.Kill(pid, unix.SIGKILL) //nolint:errcheck // it may be gone
					}
				}
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("removing %s: %v", dir, err)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		unix.Rmdir(filepath.Dir(dir)) //nolint:errcheck // still in use by another container's
	}
}

// RemoveContainParents removes kc-watchman/, the parent of the cgroups
// kc-hook supervise makes, from each hierarchy where it is empty: tests
// leave the host as they found it. One that holds a cgroup (another
// package's test running) stays.
func RemoveContainParents() {
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"} {
		unix.Rmdir(filepath.Join(m, "kc-watchman")) //nolint:errcheck // absent, or in use
	}
}
