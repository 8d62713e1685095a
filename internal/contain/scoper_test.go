package contain

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
)

// fakeScoper stands in for systemd: a scope is a directory it makes in
// kc-watchman.slice on the cgroup2 mount, the pid moved into it, and
// StopScope removes it. The D-Bus client itself is tested against a
// private dbus-daemon in its own package.
type fakeScoper struct {
	mount string
	path  string // what StartScope answers; "" for the real one
	mu    sync.Mutex
	calls []string
}

func (f *fakeScoper) StartScope(_ context.Context, unit, slice string, pid int) (string, error) {
	f.mu.Lock()
	f.calls = append(f.calls, "start "+unit+" "+slice)
	f.mu.Unlock()
	if f.path != "" {
		return f.path, nil
	}
	if slice != Slice {
		return "", errors.New("scope asked in slice " + slice)
	}
	dir := filepath.Join(f.mount, SlicePath, unit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return "", err
	}
	return "/" + SlicePath + "/" + unit, nil
}

func (f *fakeScoper) StopScope(_ context.Context, unit string) error {
	f.mu.Lock()
	f.calls = append(f.calls, "stop "+unit)
	f.mu.Unlock()
	err := os.Remove(filepath.Join(f.mount, SlicePath, unit))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func (f *fakeScoper) Close() error { return nil }

func nopScoper(context.Context) (Scoper, error) { return &fakeScoper{}, nil }

// TestSystemdScope: with a Scoper, the supervisor is moved into a scope
// right after start, the scope's path is checked, and the sweep kills
// what is in it and stops the unit.
func TestSystemdScope(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	real := Detect(Options{})
	if real.Kind != KindCgroup2 {
		t.Skipf("no cgroup v2 to stand in for systemd's: %s", real.Why)
	}
	marker := t.TempDir()
	f := &fakeScoper{mount: real.Mount}
	opt := Options{SystemdMarker: marker, Systemd: func(context.Context) (Scoper, error) { return f, nil }}
	h := Detect(opt)
	if h.Kind != KindSystemd {
		t.Fatalf("Detect = %s (%s), want systemd", h.Kind, h.Why)
	}
	c, id := preparedScope(t, h, real.Mount)
	if _, ok := c.CloneFD(); ok {
		t.Error("a systemd scope offered a cgroup fd: systemd moves the pid")
	}
	cmd := exec.Command("sleep", "1000000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := c.Enter(context.Background(), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if c.Path != SlicePath+"/"+UnitName(id) || c.Record().Unit != UnitName(id) {
		t.Fatalf("cgroup %+v, want the scope in %s", c.Record(), Slice)
	}
	// A record names it as the reap path finds it again.
	again, err := FromRecord(c.Record(), id, opt)
	if err != nil {
		t.Fatal(err)
	}
	res := Sweep(context.Background(), again, SweepOptions{})
	if res.Outcome != action.Reaped || res.Method != "cgroup.kill" || !res.Removed {
		t.Errorf("sweep %+v, want reaped by cgroup.kill and the scope stopped", res)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("the scope's process lives")
	}
	if got := f.calls; len(got) != 2 || got[1] != "stop "+UnitName(id) {
		t.Errorf("scoper calls %q, want a start and a stop", got)
	}
}

// preparedScope prepares a new container's scope on h, standing in for
// systemd's on the cgroup v2 mount; the scope and its slices go with
// the test.
func preparedScope(t *testing.T, h Host, mount string) (*Cgroup, string) {
	t.Helper()
	id := newID(t)
	t.Cleanup(func() {
		os.Remove(filepath.Join(mount, SlicePath, UnitName(id)))
		os.Remove(filepath.Join(mount, SlicePath))
		os.Remove(filepath.Join(mount, "kc.slice"))
	})
	c, err := Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, id
}

// TestSystemdScopeElsewhere: a scope systemd put anywhere but directly in
// kc-watchman.slice is refused: its path is what later sweeps trust.
func TestSystemdScopeElsewhere(t *testing.T) {
	id := newID(t)
	// The sweep below must reach the hierarchy, as a wrapper's would: a
	// real cgroup v2 mount, and a caller in a cgroup of its own.
	mount := Detect(Options{}).Mount
	if mount == "" {
		mount = "/sys/fs/cgroup"
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "cgroup"), []byte("0::/kc-test-elsewhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/system.slice/" + UnitName(id), "/" + SlicePath + "/../" + UnitName(id), "/" + SlicePath + "/x/" + UnitName(id), "/" + Slice + "/" + UnitName(id), "/"} {
		f := &fakeScoper{path: p}
		c := &Cgroup{Kind: KindSystemd, Mount: mount, Unit: UnitName(id), scoper: f, dirFD: -1, opt: Options{Proc: proc}.withDefaults()}
		if err := c.Enter(context.Background(), 1); !errors.Is(err, ErrRefused) || c.Path != "" {
			t.Errorf("scope at %q: %v, path %q; want refused", p, err, c.Path)
		}
		// The unit may be another wrapper's: a sweep of what was never
		// entered must not stop it (systemd would kill all in it).
		if res := Sweep(context.Background(), c, SweepOptions{}); res.Outcome != action.SkipForeign || res.Removed {
			t.Errorf("scope at %q: sweep %+v, want refused", p, res)
		}
		f.mu.Lock()
		for _, call := range f.calls {
			if strings.HasPrefix(call, "stop") {
				t.Errorf("scope at %q: the unit was stopped", p)
			}
		}
		f.mu.Unlock()
	}
}

// countingScoper counts the connections to systemd still open.
type countingScoper struct {
	*fakeScoper
	open *atomic.Int32
}

func (c countingScoper) Close() error { c.open.Add(-1); return nil }

// TestSystemdScopeHoldsNoConnection: a wrapper connects to systemd for
// each call only (root's bus connections are capped, and runtimes need
// theirs); and a command restarted after systemd collected its scope
// (empty once the command exited) gets a new one, not none.
func TestSystemdScopeHoldsNoConnection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	real := Detect(Options{})
	if real.Kind != KindCgroup2 {
		t.Skipf("no cgroup v2 to stand in for systemd's: %s", real.Why)
	}
	f := &fakeScoper{mount: real.Mount}
	var open atomic.Int32
	opt := Options{SystemdMarker: t.TempDir(), Systemd: func(context.Context) (Scoper, error) {
		open.Add(1)
		return countingScoper{f, &open}, nil
	}}
	c, id := preparedScope(t, Detect(opt), real.Mount)
	scope := filepath.Join(real.Mount, SlicePath, UnitName(id))
	for round := range 2 {
		cmd := exec.Command("sleep", "1000000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if err := c.Enter(context.Background(), cmd.Process.Pid); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if n := open.Load(); n != 0 {
			t.Errorf("round %d: %d connections to systemd held after the scope started", round, n)
		}
		data, err := os.ReadFile(filepath.Join(scope, "cgroup.procs"))
		if err != nil || !strings.Contains(string(data), strconv.Itoa(cmd.Process.Pid)) {
			t.Errorf("round %d: the command is not in its scope: %q, %v", round, data, err)
		}
		cmd.Process.Kill()
		cmd.Wait() //nolint:errcheck // killed
		// systemd collects the emptied scope.
		if !within(5*time.Second, func() bool { return os.Remove(scope) == nil }) {
			t.Fatal("the scope's cgroup would not go")
		}
	}
	f.mu.Lock()
	starts := 0
	for _, call := range f.calls {
		if strings.HasPrefix(call, "start ") {
			starts++
		}
	}
	f.mu.Unlock()
	if starts != 2 {
		t.Errorf("scopes started: %d, want one per command", starts)
	}
}
