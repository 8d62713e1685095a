package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestHookLogRotates: a hook log at its cap is renamed to .1 (replacing
// the older one) by the next hook, once even when many hooks open it at
// the same moment; below the cap it is appended to.
func TestHookLogRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kc-hook.log")
	const max = 4096
	old := bytes.Repeat([]byte("o"), max)
	testutil.WriteFile(t, path, old, 0o600)
	testutil.WriteFile(t, path+".1", []byte("oldest"), 0o600)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := openRotated(path, max)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.WriteString(strings.Repeat("n", 10) + "\n"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	rotated, err := os.ReadFile(path + ".1")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The hooks that opened the full log before it was renamed wrote
	// their line into what is now .1; none is lost.
	lines := strings.Count(string(rotated), "\n") + strings.Count(string(cur), "\n")
	if !bytes.HasPrefix(rotated, old) || lines != 32 || len(cur) >= max {
		t.Errorf(".1 starts with the full log: %v; %d lines kept, want 32; current log %d bytes, want below %d", bytes.HasPrefix(rotated, old), lines, len(cur), max)
	}

	// Below the cap: appended, no rotation.
	f, err := openRotated(path, max)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("more\n")
	f.Close()
	if again, _ := os.ReadFile(path + ".1"); !bytes.Equal(again, rotated) {
		t.Error("a log below its cap was rotated")
	}
	if b, _ := os.ReadFile(path); !strings.HasSuffix(string(b), "more\n") || !strings.HasPrefix(string(b), string(cur)) {
		t.Error("a log below its cap was not appended to")
	}
}

// TestHookLogRefusesASymlink: a kc-hook.log that is a symlink is neither
// written through nor rotated: root's hook must not append to, or rename,
// whatever the link names.
func TestHookLogRefusesASymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	big := bytes.Repeat([]byte("t"), 8192)
	testutil.WriteFile(t, target, big, 0o600)
	path := filepath.Join(dir, "kc-hook.log")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if f, err := openRotated(path, 4096); err == nil {
		f.Close()
		t.Fatal("a symlinked log was opened")
	}
	if data, _ := os.ReadFile(target); !bytes.Equal(data, big) {
		t.Error("the link's target was written")
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was moved: %v", err)
	}
	if _, err := os.Lstat(path + ".1"); err == nil {
		t.Error("the link was rotated")
	}
}

// TestHookLogDoesNotWaitOnAFIFO: a FIFO at the log's name, which no one
// reads, is refused at once rather than holding the hook (and the
// container's stop) until the runtime's timeout.
func TestHookLogDoesNotWaitOnAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kc-hook.log")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	testutil.NotBlockedBy(t, path, func() {
		var f *os.File
		if f, err = openRotated(path, 4096); err == nil {
			f.Close()
		}
	})
	if err == nil {
		t.Error("a FIFO no one reads was opened as the log")
	}
}

// TestHookLogOnlyOurs: the log is a regular file of the hook's own UID,
// or /dev/null; a FIFO someone reads (it would hold every write once its
// buffer filled) and another user's file are refused.
func TestHookLogOnlyOurs(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "read.log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	reader, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	theirs := filepath.Join(dir, "theirs.log")
	testutil.WriteFile(t, theirs, nil, 0o666)
	if os.Geteuid() == 0 {
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	linked := filepath.Join(dir, "linked.log")
	testutil.WriteFile(t, linked, nil, 0o600)
	if err := os.Link(linked, filepath.Join(dir, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"a FIFO with a reader", fifo, false},
		{"a file with another name", linked, false},
		{"another user's file", theirs, os.Geteuid() != 0},
		{"/dev/null", "/dev/null", true},
		{"a new file", filepath.Join(dir, "new.log"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := openRotated(tc.path, 4096)
			if err == nil {
				f.Close()
			}
			if (err == nil) != tc.ok {
				t.Errorf("openRotated(%s) = %v; want opened %v", tc.path, err, tc.ok)
			}
		})
	}
}

// TestHookLogMakesOnlyTheStateDir: the default log's state dir is made
// when missing; a --log-file in a directory that does not exist (a typo in
// a descriptor) is not, and the hook logs to stderr instead.
func TestHookLogMakesOnlyTheStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	_, closeLog, err := openLog(state, "", slog.LevelInfo, io.Discard)
	if err != nil {
		t.Fatalf("default log: %v", err)
	}
	closeLog()
	if _, err := os.Stat(filepath.Join(state, "kc-hook.log")); err != nil {
		t.Errorf("default log not made in the state dir: %v", err)
	}
	typo := filepath.Join(t.TempDir(), "var", "lgo", "kc-hook.log")
	_, closeLog, err = openLog(state, typo, slog.LevelInfo, io.Discard)
	closeLog()
	if err == nil {
		t.Error("a --log-file in a missing directory was opened")
	}
	if _, err := os.Stat(filepath.Dir(filepath.Dir(typo))); !os.IsNotExist(err) {
		t.Errorf("the --log-file's directories were made: %v", err)
	}
}

// TestHookLogNotInAnUntrustedStateDir: the default log is not written in a
// state dir the ledger would refuse (others may write it): the hook logs
// to stderr, and nothing is created there.
func TestHookLogNotInAnUntrustedStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o777); err != nil {
		t.Fatal(err)
	}
	_, closeLog, err := openLog(state, "", slog.LevelInfo, io.Discard)
	closeLog()
	if err == nil || !strings.Contains(err.Error(), "ledger not used") {
		t.Errorf("openLog in a world-writable state dir: %v; want the ledger's refusal", err)
	}
	if _, err := os.Lstat(filepath.Join(state, "kc-hook.log")); !os.IsNotExist(err) {
		t.Errorf("a log was created in it: %v", err)
	}
}

// TestHookLogMakesNothingThroughAnUntrustedParent: the default log's state
// dir is made as the ledger makes one: not through a directory or symlink
// another user could change.
func TestHookLogMakesNothingThroughAnUntrustedParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it gives a directory away")
	}
	base := t.TempDir()
	open, target := filepath.Join(base, "open"), filepath.Join(base, "target")
	for _, d := range []string{open, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(open, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(open, "lnk")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, closeLog, err := openLog(filepath.Join(link, "state"), "", slog.LevelInfo, io.Discard)
	closeLog()
	if err == nil {
		t.Error("the default log was opened through another user's symlink")
	}
	if left, _ := os.ReadDir(target); len(left) != 0 {
		t.Errorf("the link's target holds %v; want nothing made there", left)
	}
}

// TestHookLogRotatesOnlyOverItsOwn: the rename to .1 replaces only a
// previous log (a regular file of ours, one name). A directory, a
// symlink or another user's file there (a --log-file in a directory
// others write) is left as it is, the link's target too, and the log
// starts over rather than grow without bound.
func TestHookLogRotatesOnlyOverItsOwn(t *testing.T) {
	for _, tc := range []struct {
		name string
		// plant lays out path.1; returns what must be left as it is
		// ("" for nothing).
		plant   func(t *testing.T, old string) string
		rotated bool
	}{
		{"nothing there", func(t *testing.T, old string) string { return "" }, true},
		{"a previous log", func(t *testing.T, old string) string {
			testutil.WriteFile(t, old, []byte("oldest"), 0o600)
			return ""
		}, true},
		{"a directory", func(t *testing.T, old string) string {
			if err := os.Mkdir(old, 0o755); err != nil {
				t.Fatal(err)
			}
			return old
		}, false},
		{"a symlink", func(t *testing.T, old string) string {
			target := filepath.Join(t.TempDir(), "target")
			testutil.WriteFile(t, target, []byte("theirs"), 0o644)
			if err := os.Symlink(target, old); err != nil {
				t.Fatal(err)
			}
			return target
		}, false},
		{"a hard link to a file of ours elsewhere", func(t *testing.T, old string) string {
			other := filepath.Join(t.TempDir(), "ours")
			if err := os.WriteFile(other, []byte("ours, elsewhere"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(other, old); err != nil {
				t.Fatal(err)
			}
			return other
		}, false},
		{"another user's file", func(t *testing.T, old string) string {
			if os.Geteuid() != 0 {
				t.Skip("needs root to make a file of another user's")
			}
			testutil.WriteFile(t, old, []byte("theirs"), 0o644)
			if err := os.Chown(old, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return old
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kc-hook.log")
			kept := tc.plant(t, path+".1")
			var before os.FileInfo
			var beforeData []byte
			if kept != "" {
				var err error
				if before, err = os.Lstat(path + ".1"); err != nil {
					t.Fatal(err)
				}
				beforeData, _ = os.ReadFile(kept)
			}
			const max = 4096
			line := strings.Repeat("x", 99) + "\n"
			for range 200 {
				f, err := openRotated(path, max)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteString(line)
				f.Close()
			}
			if st, err := os.Stat(path); err != nil || st.Size() > 2*max {
				t.Errorf("log %v, %v; want it under %d bytes", st.Size(), err, 2*max)
			}
			after, err := os.Lstat(path + ".1")
			switch {
			case tc.rotated && (err != nil || !after.Mode().IsRegular() || after.Size() == 0 || after.Size() > 2*max):
				t.Errorf("%s.1: %v, %v; want the rotated log", path, after, err)
			case !tc.rotated && (err != nil || !unchanged(before, after)):
				t.Errorf("%s.1 replaced: %v, %v", path, after, err)
			}
			if kept != "" {
				if data, _ := os.ReadFile(kept); !bytes.Equal(data, beforeData) {
					t.Errorf("%s changed: %q, was %q", kept, data, beforeData)
				}
			}
		})
	}
}

// unchanged reports whether b is still a: a name whose file was replaced
// can get the freed inode number again.
func unchanged(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Mode() == b.Mode() && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
