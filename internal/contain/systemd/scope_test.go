package systemd

// These tests run against the D-Bus double (double_test.go): a private
// dbus-daemon and a fake systemd Manager, because the machines they run on
// do not run systemd as PID 1. They pin what systemd documents; the real
// systemd path is not exercised here.

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

// scoper is internal/contain's Scoper, declared again so this package
// need not import its user: *Manager must satisfy it.
type scoper interface {
	StartScope(ctx context.Context, unit, slice string, pid int) (cgroup string, err error)
	StopScope(ctx context.Context, unit string) error
	Close() error
}

var _ scoper = (*Manager)(nil)

const (
	testUnit  = "kc-test.scope"
	testSlice = "kc-watchman.slice"
	testPID   = 4242
)

// hungWait bounds the calls a hung systemd never finishes.
const hungWait = 500 * time.Millisecond

func dialDouble(t *testing.T, addr string) *Manager {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Dial(ctx, addr)
	if err != nil {
		t.Fatalf("Dial %s: %v", addr, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestStartScopeProperties(t *testing.T) {
	f, addr := newSystemd(t)
	f.result = "done"
	m := dialDouble(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cg, err := m.StartScope(ctx, testUnit, testSlice, testPID)
	if err != nil {
		t.Fatalf("StartScope: %v", err)
	}
	if want := "/kc.slice/kc-watchman.slice/kc-test.scope"; cg != want {
		t.Errorf("cgroup = %q, want %q", cg, want)
	}
	starts, _ := f.record()
	if len(starts) != 1 {
		t.Fatalf("systemd got %d StartTransientUnit calls, want 1", len(starts))
	}
	got := starts[0]
	if got.Signature != "ssa(sv)a(sa(sv))" || got.Name != testUnit || got.Mode != "fail" || got.Aux != 0 {
		t.Errorf("StartTransientUnit(%q, %q, …, %d aux) with signature %q; want (%q, \"fail\", …, 0 aux) with ssa(sv)a(sa(sv))",
			got.Name, got.Mode, got.Aux, got.Signature, testUnit)
	}
	// Types matter: systemd's transient-unit parser refuses a property
	// whose variant has another signature.
	want := map[string]struct {
		sig   string
		value any
	}{
		"Description": {"s", "kc-watchman supervised tree of pid 4242"},
		"Slice":       {"s", testSlice},
		"Delegate":    {"b", true},
		"PIDs":        {"au", []uint32{testPID}},
		"CollectMode": {"s", "inactive-or-failed"},
	}
	if len(got.Props) != len(want) {
		t.Errorf("properties %v, want exactly %d", got.Order, len(want))
	}
	for name, w := range want {
		v, ok := got.Props[name]
		if !ok {
			t.Errorf("property %s not sent", name)
			continue
		}
		if v.Signature().String() != w.sig || !reflect.DeepEqual(v.Value(), w.value) {
			t.Errorf("property %s = %s %#v, want %s %#v", name, v.Signature(), v.Value(), w.sig, w.value)
		}
	}
}

func TestStartScope(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeSystemd)
		unit  string // testUnit if ""
		want  string // the cgroup, if no error
		err   string // in the error, if one
		is    error  // errors.Is the error, if set
		calls int    // StartTransientUnit calls systemd got
	}{
		{name: "JobRemoved after the reply", setup: func(f *fakeSystemd) { f.result = "done" },
			want: "/kc.slice/kc-watchman.slice/kc-test.scope", calls: 1},
		{name: "JobRemoved before the reply", setup: func(f *fakeSystemd) { f.result, f.before = "done", true },
			want: "/kc.slice/kc-watchman.slice/kc-test.scope", calls: 1},
		{name: "another job's JobRemoved first", setup: func(f *fakeSystemd) { f.result, f.before, f.decoy = "done", true, true },
			want: "/kc.slice/kc-watchman.slice/kc-test.scope", calls: 1},
		{name: "user manager's root before the slice", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("/user.slice/user-1000.slice/user@1000.service/kc.slice/kc-watchman.slice/kc-test.scope")
		}, want: "/user.slice/user-1000.slice/user@1000.service/kc.slice/kc-watchman.slice/kc-test.scope", calls: 1},
		{name: "escaped cgroup name", unit: "cpu.scope", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("/kc.slice/kc-watchman.slice/_cpu.scope")
		}, want: "/kc.slice/kc-watchman.slice/_cpu.scope", calls: 1},
		{name: "job failed", setup: func(f *fakeSystemd) { f.result = "failed" },
			err: `could not start scope kc-test.scope in kc-watchman.slice for pid 4242: its job ended "failed"`, calls: 1},
		{name: "job canceled", setup: func(f *fakeSystemd) { f.result, f.before = "canceled", true },
			err: `its job ended "canceled"`, calls: 1},
		{name: "unit exists", setup: func(f *fakeSystemd) {
			f.startErr = dbus.NewError(errNameUnitExists, []any{"Unit kc-test.scope already exists."})
		}, err: "kc-test.scope: systemd already has a unit of that name", is: ErrUnitExists, calls: 1},
		{name: "other D-Bus error", setup: func(f *fakeSystemd) {
			f.startErr = dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Access denied"})
		}, err: "starting scope kc-test.scope in kc-watchman.slice for pid 4242: Access denied", calls: 1},
		{name: "systemd never answers", setup: func(f *fakeSystemd) { f.hangCall = true },
			is: context.DeadlineExceeded, calls: 1},
		{name: "no JobRemoved ever", setup: func(f *fakeSystemd) { f.result = "" },
			err: "waiting for systemd's job", is: context.DeadlineExceeded, calls: 1},
		{name: "JobRemoved forged by another connection", setup: func(f *fakeSystemd) { f.result, f.forge = "", true },
			is: context.DeadlineExceeded, calls: 1},
		{name: "ControlGroup outside the slice", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("/system.slice/kc-test.scope")
		}, err: "refusing scope kc-test.scope", is: errOutside, calls: 1},
		{name: "ControlGroup of another scope", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("/kc.slice/kc-watchman.slice/other.scope")
		}, is: errOutside, calls: 1},
		{name: "ControlGroup climbing out", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("/kc.slice/kc-watchman.slice/../../kc.slice/kc-watchman.slice/kc-test.scope")
		}, is: errOutside, calls: 1},
		{name: "ControlGroup relative", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.cg = dbus.MakeVariant("kc.slice/kc-watchman.slice/kc-test.scope")
		}, is: errOutside, calls: 1},
		{name: "ControlGroup empty", setup: func(f *fakeSystemd) { f.result, f.cg = "done", dbus.MakeVariant("") },
			err: "no cgroup for kc-test.scope", calls: 1},
		{name: "ControlGroup not a string", setup: func(f *fakeSystemd) { f.result, f.cg = "done", dbus.MakeVariant(uint32(7)) },
			err: "has type u, not a string", calls: 1},
		{name: "scope gone before its cgroup is read", setup: func(f *fakeSystemd) {
			f.result = "done"
			f.getUnitErr = dbus.NewError(errNameNoSuchUnit, []any{"Unit kc-test.scope not loaded."})
		}, err: "systemd no longer has kc-test.scope", calls: 1},
		{name: "unit name with a slash never reaches the bus", unit: "../x.scope", err: "must begin with a letter or digit"},
		{name: "unit name with a space never reaches the bus", unit: "kc test.scope", err: `character ' '`},
		{name: "template unit name never reaches the bus", unit: "kc@1.scope", err: `character '@'`},
		{name: "service name never reaches the bus", unit: "kc-test.service", err: `want a name ending in ".scope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, addr := newSystemd(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			m := dialDouble(t, addr)
			unit := tc.unit
			if unit == "" {
				unit = testUnit
			}
			ctx, cancel := context.WithTimeout(context.Background(), hungWait)
			defer cancel()
			cg, err := m.StartScope(ctx, unit, testSlice, testPID)
			wantErr := tc.err != "" || tc.is != nil
			switch {
			case wantErr && err == nil:
				t.Fatalf("StartScope = %q, want an error", cg)
			case !wantErr && err != nil:
				t.Fatalf("StartScope: %v", err)
			case !wantErr && cg != tc.want:
				t.Errorf("cgroup = %q, want %q", cg, tc.want)
			}
			if err != nil && tc.err != "" && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %q does not say %q", err, tc.err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %v", err, tc.is)
			}
			if starts, _ := f.record(); len(starts) != tc.calls {
				t.Errorf("systemd got %d StartTransientUnit calls, want %d", len(starts), tc.calls)
			}
		})
	}
}

func TestStartScopeRefusesBeforeTheBus(t *testing.T) {
	f, addr := newSystemd(t)
	f.result = "done"
	m := dialDouble(t, addr)
	for _, tc := range []struct {
		name, unit, slice string
		pid               int
	}{
		{"slice of the wrong type", testUnit, "kc-watchman.scope", testPID},
		{"slice with a trailing dash", testUnit, "kc-.slice", testPID},
		{"slice with a double dash", testUnit, "kc--watchman.slice", testPID},
		{"root slice", testUnit, "-.slice", testPID},
		{"empty slice", testUnit, "", testPID},
		{"pid 0", testUnit, testSlice, 0},
		{"pid 1", testUnit, testSlice, 1},
		{"negative pid", testUnit, testSlice, -5},
		{"pid beyond 32 bits", testUnit, testSlice, 1 << 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hungWait)
			defer cancel()
			if cg, err := m.StartScope(ctx, tc.unit, tc.slice, tc.pid); err == nil {
				t.Errorf("StartScope(%q, %q, %d) = %q, want an error", tc.unit, tc.slice, tc.pid, cg)
			}
		})
	}
	if starts, _ := f.record(); len(starts) != 0 {
		t.Errorf("systemd got %d StartTransientUnit calls, want none", len(starts))
	}
}

func TestStopScope(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeSystemd)
		unit  string
		err   string
		is    error
		stops int
	}{
		{name: "stopped", setup: func(f *fakeSystemd) { f.result = "done" }, stops: 1},
		{name: "stopped, JobRemoved before the reply", setup: func(f *fakeSystemd) { f.result, f.before = "done", true }, stops: 1},
		{name: "unit already gone", setup: func(f *fakeSystemd) {
			f.stopErr = dbus.NewError(errNameNoSuchUnit, []any{"Unit kc-test.scope not loaded."})
		}, stops: 1},
		{name: "job failed", setup: func(f *fakeSystemd) { f.result = "failed" },
			err: `could not stop scope kc-test.scope: its job ended "failed"`, stops: 1},
		{name: "other D-Bus error", setup: func(f *fakeSystemd) {
			f.stopErr = dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Access denied"})
		}, err: "stopping scope kc-test.scope: Access denied", stops: 1},
		{name: "systemd never answers", setup: func(f *fakeSystemd) { f.hangCall = true }, is: context.DeadlineExceeded, stops: 1},
		{name: "no JobRemoved ever", setup: func(f *fakeSystemd) {}, is: context.DeadlineExceeded, stops: 1},
		{name: "invalid name never reaches the bus", unit: "kc-test.scope/../x.scope", err: "character '/'"},
		{name: "slice never reaches the bus", unit: testSlice, err: `want a name ending in ".scope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, addr := newSystemd(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			m := dialDouble(t, addr)
			unit := tc.unit
			if unit == "" {
				unit = testUnit
			}
			ctx, cancel := context.WithTimeout(context.Background(), hungWait)
			defer cancel()
			err := m.StopScope(ctx, unit)
			wantErr := tc.err != "" || tc.is != nil
			if wantErr != (err != nil) {
				t.Fatalf("StopScope: %v, want an error: %v", err, wantErr)
			}
			if err != nil && tc.err != "" && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %q does not say %q", err, tc.err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %v", err, tc.is)
			}
			_, stops := f.record()
			if len(stops) != tc.stops {
				t.Fatalf("systemd got %d StopUnit calls, want %d", len(stops), tc.stops)
			}
			if len(stops) == 1 && stops[0] != [2]string{testUnit, "replace"} {
				t.Errorf("StopUnit%q, want (%q, \"replace\")", stops[0], testUnit)
			}
		})
	}
}

// TestDialDefaults: "" is the system bus named by DBUS_SYSTEM_BUS_ADDRESS,
// and DialUser finds the user bus at $XDG_RUNTIME_DIR/bus.
func TestDialDefaults(t *testing.T) {
	dir := t.TempDir()
	addr := startBus(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	m, err := Dial(ctx, "")
	if err != nil {
		t.Fatalf("Dial(\"\") with DBUS_SYSTEM_BUS_ADDRESS=%s: %v", addr, err)
	}
	m.Close()

	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "")
	t.Setenv("XDG_RUNTIME_DIR", dir)
	m, err = DialUser(ctx)
	if err != nil {
		t.Fatalf("DialUser with XDG_RUNTIME_DIR=%s: %v", dir, err)
	}
	m.Close()

	t.Setenv("XDG_RUNTIME_DIR", "")
	if m, err := DialUser(ctx); err == nil {
		m.Close()
		t.Error("DialUser without XDG_RUNTIME_DIR or DBUS_SESSION_BUS_ADDRESS succeeded")
	}
}

// TestDialDeadline: a bus that accepts the connection and never answers
// the handshake does not hold Dial past its context.
func TestDialDeadline(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), hungWait)
	defer cancel()
	start := time.Now()
	m, err := Dial(ctx, "unix:path="+sock)
	if err == nil {
		m.Close()
		t.Fatal("Dial to a mute bus succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %q is not the deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Dial took %v against a %v deadline", took, hungWait)
	}
}

func TestDialNoBus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "none")
	if m, err := Dial(ctx, "unix:path="+sock); err == nil {
		m.Close()
		t.Fatal("Dial to a missing socket succeeded")
	} else if !strings.Contains(err.Error(), sock) {
		t.Errorf("error %q does not name the address", err)
	}
}

func TestBooted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(root string) error
		want  bool
	}{
		{"directory", func(root string) error { return os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755) }, true},
		{"missing", func(root string) error { return os.MkdirAll(filepath.Join(root, "run/systemd"), 0o755) }, false},
		{"a file", func(root string) error {
			if err := os.MkdirAll(filepath.Join(root, "run/systemd"), 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(root, "run/systemd/system"), nil, 0o644)
		}, false},
		{"nothing at all", func(string) error { return nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := tc.setup(root); err != nil {
				t.Fatal(err)
			}
			if got := Booted(root); got != tc.want {
				t.Errorf("Booted = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDialRefusesOtherTransports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, addr := range []string{
		"tcp:host=127.0.0.1,port=1",
		"unix:path=/nonexistent;tcp:host=127.0.0.1,port=1",
		"nonce-tcp:host=127.0.0.1,port=1",
		"unixexec:path=/bin/true",
	} {
		t.Run(addr, func(t *testing.T) {
			m, err := Dial(ctx, addr)
			if err == nil {
				m.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), "only unix: transports") {
				t.Errorf("error %q is not the transport refusal", err)
			}
		})
	}
}

// TestNoDeadline: a context without a deadline still works; the package
// supplies one.
func TestNoDeadline(t *testing.T) {
	f, addr := newSystemd(t)
	f.result = "done"
	m, err := Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if _, err := m.StartScope(context.Background(), testUnit, testSlice, testPID); err != nil {
		t.Fatal(err)
	}
	if err := m.StopScope(context.Background(), testUnit); err != nil {
		t.Fatal(err)
	}
}
