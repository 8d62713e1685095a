package fingerprint_test

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// argvReaders are every way kc-watchman reads a process's argv.
func argvReaders(r *proctable.Reader, pid int) []struct {
	name string
	read func() ([]string, error)
} {
	return []struct {
		name string
		read func() ([]string, error)
	}{
		{"fingerprint.ReadArgv", func() ([]string, error) { return fingerprint.ReadArgv(root, pid) }},
		{"fingerprint.Read", func() ([]string, error) { id, err := fingerprint.Read(root, pid); return id.Argv, err }},
		{"proctable.Reader.Argv", func() ([]string, error) { return r.Argv(pid) }},
		{"proctable.Reader.Identity", func() ([]string, error) { id, err := r.Identity(pid); return id.Argv, err }},
	}
}

// readArgvWithin reads argv with read, failing t if it has not returned
// after 20 s: a read held by a user's FUSE server would never return.
func readArgvWithin(t *testing.T, name string, read func() ([]string, error)) []string {
	t.Helper()
	type result struct {
		argv []string
		err  error
	}
	got := testutil.Within(t, 20*time.Second, name, func() result {
		argv, err := read()
		return result{argv, err}
	})
	if got.err != nil {
		t.Fatalf("%s: %v", name, got.err)
	}
	return got.argv
}

// A user can try to make reading his process's argv wait on his own
// FUSE server, which need never answer: the two ways below are the known
// ones (CVE-2018-1120). kc-watchman reads argv only through
// /proc/<pid>/cmdline, which Linux (4.17 on) reads from anonymous memory
// alone, never through /proc/<pid>/mem or process_vm_readv, which read
// file-backed pages; and it gives up on a read that waits for the memory
// map's lock (fingerprint.ReadMemory).

// TestArgvMappedFromAnUnansweringFUSEFile: the process maps the file over
// its argv. cmdline stops where the mapping starts, without asking.
func TestArgvMappedFromAnUnansweringFUSEFile(t *testing.T) {
	f := testutil.ServeStalledFile(t, t.TempDir(), "fuse")
	m, err := proc.StartMappedArgv(&syscall.SysProcAttr{Setpgid: true}, f.Path, "kcserver", "--mapped")
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the server's cleanup, so run before it.
	t.Cleanup(m.Close)
	r := proctable.NewReader(root)
	t.Cleanup(r.Close)
	for _, rd := range argvReaders(r, m.PID) {
		t.Run(rd.name, func(t *testing.T) {
			argv := readArgvWithin(t, rd.name, rd.read)
			if slices.Contains(argv, "--mapped") {
				// The last argument lies past the mapped pages.
				t.Fatalf("%s read %d arguments, the mapped ones among them", rd.name, len(argv))
			}
			if n := f.Reads(); n != 0 {
				t.Fatalf("%s asked the FUSE server for the file %d times", rd.name, n)
			}
		})
	}
}

// TestArgvOfAProcessFaultingOnAnUnansweringFUSEFile: one thread of the
// process faults on a mapping of the file; the server fails the fault's
// read, the fault is retried holding the memory map's lock, and the
// server never answers the retry's read. Another thread asks for the lock
// to write and waits, and every reader of cmdline waits behind it (Linux
// 6.18 here: checked with the reads made directly, each hung). Each
// reader gives up with ErrStalled instead, after a second (the first) or
// at once (the rest, while that read is out), and stat and status, which
// the scan reads first, still read. Where the fault does not hold the
// lock, the writer gets it and every reader reads. A reader that hangs
// fails.
func TestArgvOfAProcessFaultingOnAnUnansweringFUSEFile(t *testing.T) {
	h, held := proc.HoldMemoryLock(t, "")
	t.Logf("the fault holds the memory map's lock: %v", held)
	r := proctable.NewReader(root)
	t.Cleanup(r.Close)
	for _, file := range []string{"stat", "status"} {
		err := testutil.Within(t, 20*time.Second, file, func() error { _, err := r.ReadFile(h.PID, file); return err })
		if err != nil {
			t.Errorf("%s: %v", file, err)
		}
	}
	for _, rd := range argvReaders(r, h.PID) {
		t.Run(rd.name, func(t *testing.T) {
			type result struct {
				argv []string
				err  error
			}
			got := testutil.Within(t, 20*time.Second, rd.name, func() result {
				argv, err := rd.read()
				return result{argv, err}
			})
			switch stalled := errors.Is(got.err, fingerprint.ErrStalled); {
			case held && !stalled:
				if got.err == nil && h.Mapped(5*time.Second) {
					held = false // the mapping was only slow; nothing held the lock
					return
				}
				t.Fatalf("%s = %d arguments, %v; want ErrStalled", rd.name, len(got.argv), got.err)
			case !held && (got.err != nil || len(got.argv) == 0):
				t.Fatalf("%s = %q, %v; want the argv", rd.name, got.argv, got.err)
			}
		})
	}
}
