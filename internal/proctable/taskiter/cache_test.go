package taskiter

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

const testBoot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"

func cacheLayout() layout {
	l := progLayout
	l.rdonlyCast, l.taskStruct = 65425, 114
	l.walkNew, l.walkNext, l.walkDestroy = 64198, 64201, 64193
	return l
}

func TestCacheRoundTrip(t *testing.T) {
	for _, l := range []layout{progLayout, cacheLayout()} {
		got, err := decodeCache(encodeCache(testBoot, l), testBoot)
		if err != nil || got != l {
			t.Errorf("decode(encode(%+v)) = %+v, %v", l, got, err)
		}
	}
}

func TestDecodeCacheRefuses(t *testing.T) {
	good := string(encodeCache(testBoot, cacheLayout()))
	tests := []struct {
		name, data, want string
	}{
		{"another boot", strings.Replace(good, testBoot, "aaaaaaaa-4b5a-6978-8796-a5b4c3d2e1f0", 1), "another boot"},
		{"another version", strings.Replace(good, cacheVersion, "kc-watchman taskiter layout 1", 1), "not a layout"},
		{"a field missing", strings.Replace(good, "cred.uid 8\n", "", 1), "not a layout"},
		{"a field renamed", strings.Replace(good, "cred.uid 8", "cred.euid 8", 1), "want cred.uid"},
		{"a line more", good + "task.pid 1\n", "not a layout"},
		{"not a number", strings.Replace(good, "cred.uid 8", "cred.uid eight", 1), "line"},
		{"beyond 32 bits", strings.Replace(good, "cred.uid 8", "cred.uid 4294967296", 1), "line"},
		{"a negative offset", strings.Replace(good, "cred.uid 8", "cred.uid -8", 1), "line"},
		{"no iterator function", strings.Replace(good, "btf.bpf_iter_task 64274", "btf.bpf_iter_task 0", 1), "no iterator function"},
		{"a PGID index that wraps its offset", strings.Replace(good, "PIDTYPE_PGID 2", "PIDTYPE_PGID 536870913", 1), "not an index"},
		{"empty", "", "not a layout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.data == good {
				t.Fatal("test setup: the edit changed nothing")
			}
			if _, err := decodeCache([]byte(resum(tt.data)), testBoot); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// resum gives an edited file the checksum of its edited contents.
func resum(data string) string {
	i := strings.LastIndex(data, "sum ")
	if i < 0 {
		return data
	}
	rest := ""
	if j := strings.IndexByte(data[i:], '\n'); j >= 0 {
		rest = data[i+j+1:]
	}
	return data[:i] + fmt.Sprintf("sum %016x\n", cacheSum([]byte(data[:i]))) + rest
}

// TestDecodeCacheChecksum: a changed digit, or a missing sum, refuses the
// file whatever the value (PIDTYPE_PGID 3 is a valid index: the session's).
func TestDecodeCacheChecksum(t *testing.T) {
	good := string(encodeCache(testBoot, cacheLayout()))
	if _, err := decodeCache([]byte(good), testBoot); err != nil {
		t.Fatalf("the file as written: %v", err)
	}
	for name, data := range map[string]string{
		"a digit changed": strings.Replace(good, "PIDTYPE_PGID 2", "PIDTYPE_PGID 3", 1),
		"the sum changed": strings.Replace(good, "sum ", "sum 0", 1)[:len(good)-1] + "\n",
		"no sum":          good[:strings.LastIndex(good, "sum ")] + "task.pid 1\n",
	} {
		t.Run(name, func(t *testing.T) {
			if data == good {
				t.Fatal("test setup: the edit changed nothing")
			}
			if _, err := decodeCache([]byte(data), testBoot); err == nil {
				t.Error("taken")
			}
		})
	}
}

func TestReadCacheRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	good := encodeCache(testBoot, cacheLayout())
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"a symlink to a good file", func(t *testing.T, path string) {
			target := path + ".real"
			write(t, target, good, 0o600)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"writable by its group", func(t *testing.T, path string) { write(t, path, good, 0o620) }},
		{"writable by all", func(t *testing.T, path string) { write(t, path, good, 0o602) }},
		{"another user's", func(t *testing.T, path string) {
			write(t, path, good, 0o600)
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
		{"a directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"a FIFO nobody writes to", func(t *testing.T, path string) {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"too large", func(t *testing.T, path string) {
			write(t, path, append(append([]byte{}, good...), make([]byte, cacheMax)...), 0o600)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "layout")
			tt.setup(t, path)
			if l, err := readCache(path, testBoot); err == nil {
				t.Errorf("read %+v from it", l)
			}
		})
	}
	t.Run("a good file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "layout")
		write(t, path, good, 0o600)
		if l, err := readCache(path, testBoot); err != nil || l != cacheLayout() {
			t.Errorf("read %+v, %v", l, err)
		}
	})
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestLoadCached: the first load writes the kernel's layout; a later one
// takes the file's; a file whose layout a pass or the verifier refutes is
// removed, and the load after it reads the BTF again.
func TestLoadCached(t *testing.T) {
	kernel := kernelWalk(t)
	boot, err := fingerprint.BootID()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "layout")
	pass := func() error {
		t.Helper()
		p, err := LoadCached(path)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		_, err = p.Each(func(*Task) {})
		return err
	}
	cached := func() (layout, error) { return readCache(path, boot) }

	if err := pass(); err != nil {
		t.Fatal(err)
	}
	if l, err := cached(); err != nil || l != kernel {
		t.Fatalf("after the first load the file holds %+v, %v; want the kernel's %+v", l, err, kernel)
	}

	// A layout that loads but reads the process group from the wrong
	// slot of signal->pids (PIDTYPE_PID's, which is never set): the
	// file's layout is used (the pass fails), then removed.
	off := kernel
	off.pidtypePGID = 0
	write(t, path, encodeCache(boot, off), 0o600)
	if err := pass(); err == nil {
		t.Fatal("a pass reading the wrong process group succeeded: the file was not used, or the self-check missed it")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the refuted file is still there: %v", err)
	}
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	if l, err := cached(); err != nil || l != kernel {
		t.Fatalf("after the refuted file the file holds %+v, %v; want the kernel's", l, err)
	}

	// A walk the verifier refuses (next's ID is the iterator function's):
	// no task iterator program in its place, the BTF decides.
	bogus := kernel
	bogus.walkNext = kernel.iterFunc
	write(t, path, encodeCache(boot, bogus), 0o600)
	p, err := LoadCached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.w == nil || p.cache != "" {
		t.Errorf("loaded from a layout the verifier refuses: walk %v, from the file %v", p.w != nil, p.cache != "")
	}
	if l, err := cached(); err != nil || l != kernel {
		t.Errorf("the file holds %+v, %v; want the kernel's", l, err)
	}
}

// TestLoadCachedWithoutAFile: a layout file that cannot be written (its
// directory is missing) costs nothing but the file: the program loads and
// lists.
func TestLoadCachedWithoutAFile(t *testing.T) {
	kernelWalk(t)
	path := filepath.Join(t.TempDir(), "missing", "layout")
	p, err := LoadCached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	seen := false
	if _, err := p.Each(func(task *Task) { seen = seen || task.PID == os.Getpid() }); err != nil || !seen {
		t.Fatalf("pass: this process seen %v, err %v", seen, err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("a layout file at %s: %v", path, err)
	}
}

// TestLoadCachedReplacesASymlink: a symlink planted at the layout's path
// is neither read nor written through: the layout file takes its place
// and the link's target is untouched.
func TestLoadCachedReplacesASymlink(t *testing.T) {
	kernelWalk(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	write(t, victim, []byte("precious"), 0o600)
	path := filepath.Join(dir, "layout")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	p, err := LoadCached(path)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("the link's target now holds %q, %v", b, err)
	}
	if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
		t.Errorf("the layout path is %v, %v; want a regular file in the link's place", st, err)
	}
}
