package metrics

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func oneSet() *Set {
	s := New()
	s.Set(StraysFound, 3)
	return s
}

// writeWithin fails the test when WriteFileWait does not return within
// limit: the old code blocked forever, and a hung test says nothing.
func writeWithin(t *testing.T, path string, s *Set, wait, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- WriteFileWait(path, s, wait) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("WriteFileWait still blocked after %v", limit)
		return nil
	}
}

// TestWriteFileIgnoresDirectoryLock: another user holding an flock on the
// metrics directory (what the old writer locked) does not delay a write.
func TestWriteFileIgnoresDirectoryLock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the holder as another user")
	}
	dir := t.TempDir()
	// The textfile directory is readable by everyone, as node_exporter's is.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	testutil.HoldFlock(t, dir, 65534)
	path := filepath.Join(dir, "kc-janitor.prom")
	if err := writeWithin(t, path, oneSet(), time.Second, 30*time.Second); err != nil {
		t.Fatalf("write under a held directory lock: %v", err)
	}
	if v, ok := value(readBack(t, path), StraysFound); !ok || v != 3 {
		t.Errorf("strays found = %v, %v; want 3", v, ok)
	}
}

// TestWriteFileLockTimeout: a write held up past its wait gives up with
// ErrLocked and leaves the file as it was; once the holder is gone the
// next write goes through.
func TestWriteFileLockTimeout(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kc-janitor.prom")
	before := New()
	before.Set(StraysFound, 1)
	if err := WriteFile(path, before); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Only the janitor's own UID can hold the lock file; here the holder
	// is another process of ours, as a second janitor stuck mid-write.
	testutil.HoldFlock(t, filepath.Join(dir, ".kc-janitor.prom.lock"), os.Geteuid())

	start := time.Now()
	err = writeWithin(t, path, oneSet(), 200*time.Millisecond, 30*time.Second)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("write under a held lock: %v, want ErrLocked", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("gave up after %v, before its wait", d)
	}
	if now, _ := os.ReadFile(path); string(now) != string(old) {
		t.Errorf("file changed by a write that gave up:\n%s", now)
	}
	t.Logf("gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestWriteFileRefusesPlantedNames: names planted in the metrics directory
// are neither followed nor trusted.
func TestWriteFileRefusesPlantedNames(t *testing.T) {
	const victimText = "# TYPE secret gauge\nsecret 42\n"
	tests := []struct {
		name    string
		plant   func(t *testing.T, dir, path, lock, victim string)
		wantErr bool
	}{
		{"symlink at the lock", func(t *testing.T, dir, path, lock, victim string) {
			mustSymlink(t, victim, lock)
		}, true},
		{"dangling symlink at the lock", func(t *testing.T, dir, path, lock, victim string) {
			mustSymlink(t, filepath.Join(dir, "created-through-link"), lock)
		}, true},
		{"lock readable by others", func(t *testing.T, dir, path, lock, victim string) {
			mustWrite(t, lock, "", 0o644)
		}, true},
		{"lock of another user", func(t *testing.T, dir, path, lock, victim string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			mustWrite(t, lock, "", 0o600)
			if err := os.Chown(lock, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"symlink at the metrics file", func(t *testing.T, dir, path, lock, victim string) {
			mustSymlink(t, victim, path)
		}, false},
		{"FIFO at the metrics file", func(t *testing.T, dir, path, lock, victim string) {
			if err := unix.Mkfifo(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "kc-janitor.prom")
			lock := filepath.Join(dir, ".kc-janitor.prom.lock")
			victim := filepath.Join(t.TempDir(), "victim")
			mustWrite(t, victim, victimText, 0o600)
			tt.plant(t, dir, path, lock, victim)

			err := writeWithin(t, path, oneSet(), 200*time.Millisecond, 30*time.Second)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if got, _ := os.ReadFile(victim); string(got) != victimText {
				t.Errorf("victim changed: %q", got)
			}
			if info, err := os.Stat(victim); err != nil || info.Mode().Perm() != 0o600 {
				t.Errorf("victim mode: %v %v", info, err)
			}
			if _, err := os.Lstat(filepath.Join(dir, "created-through-link")); err == nil {
				t.Error("a file was created through the lock's symlink")
			}
			if tt.wantErr {
				return
			}
			info, err := os.Lstat(path)
			if err != nil || !info.Mode().IsRegular() {
				t.Fatalf("metrics file not replaced by a regular file: %v %v", info, err)
			}
			fams := readBack(t, path)
			if _, ok := fams["secret"]; ok {
				t.Error("the planted target's series were copied into the metrics file")
			}
			if v, ok := value(fams, StraysFound); !ok || v != 3 {
				t.Errorf("strays found = %v, %v; want 3", v, ok)
			}
		})
	}
}

// TestWriteFileLeavesOnlyTheLock: a write leaves the metrics file and its
// private lock, no temporary files.
func TestWriteFileLeavesOnlyTheLock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kc-janitor.prom")
	if err := WriteFile(path, oneSet()); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != ".kc-janitor.prom.lock kc-janitor.prom" {
		t.Errorf("directory holds %v", names)
	}
	info, err := os.Stat(filepath.Join(dir, ".kc-janitor.prom.lock"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("lock mode: %v %v", info, err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
