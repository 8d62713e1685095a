package contain

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
)

func newID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestUnitName(t *testing.T) {
	id := strings.Repeat("ab", 32)
	for _, tc := range []struct{ id, want string }{
		{id, "kc-watchman-" + id + ".scope"},
		{"abc", ""},
		{strings.Repeat("AB", 32), ""},
		{"../" + id[3:], ""},
	} {
		t.Run(tc.id, func(t *testing.T) {
			if got := UnitName(tc.id); got != tc.want {
				t.Errorf("UnitName(%q) = %q, want %q", tc.id, got, tc.want)
			}
		})
	}
}

// TestDetect: what a host offers follows from its mount table and from
// whether PID 1 is systemd; systemd without a client linked is never
// written to directly.
func TestDetect(t *testing.T) {
	real := Detect(Options{})
	t.Logf("this host: %s (%s): %s", real.Kind, real, real.Why)
	marker := filepath.Join(t.TempDir(), "system")
	if err := os.Mkdir(marker, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := func(ctxScoper bool) Options {
		o := Options{SystemdMarker: marker}
		if ctxScoper {
			o.Systemd = nopScoper
		}
		return o
	}
	for _, tc := range []struct {
		name string
		opt  Options
		want Kind
		why  string
	}{
		{"systemd without a client", fake(false), KindNone, "never creates cgroups in a hierarchy systemd manages"},
		{"no systemd", Options{SystemdMarker: filepath.Join(t.TempDir(), "none")}, real.Kind, ""},
		{"forced freezer", Options{SystemdMarker: filepath.Join(t.TempDir(), "none"), Force: KindFreezer}, KindFreezer, "freezer"},
		{"no freezer forced under systemd", Options{SystemdMarker: marker, Force: KindFreezer}, KindNone, "never creates cgroups"},
		// A scope is asked of the system bus, which a rootless hook
		// cannot use: systemd or not, it gets the subreaper alone.
		{"rootless under systemd", Options{SystemdMarker: marker, Systemd: nopScoper, euid: func() int { return 1000 }}, KindNone, "rootless"},
		{"rootless without systemd", Options{SystemdMarker: filepath.Join(t.TempDir(), "none"), euid: func() int { return 1000 }}, KindNone, "rootless"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() != 0 && tc.want != KindNone {
				t.Skip("needs root")
			}
			h := Detect(tc.opt)
			if tc.want == KindFreezer && h.Kind != KindFreezer {
				t.Skipf("no v1 freezer here: %s", h.Why)
			}
			if h.Kind != tc.want || !strings.Contains(h.Why, tc.why) {
				t.Errorf("Detect = %s (%s), want %s with %q", h.Kind, h.Why, tc.want, tc.why)
			}
		})
	}
	if real.Kind == KindNone {
		return
	}
	t.Run("systemd with a client", func(t *testing.T) {
		h := Detect(fake(true))
		if h.Kind != KindSystemd || h.Mount == "" {
			t.Errorf("Detect = %s at %q (%s), want systemd", h.Kind, h.Mount, h.Why)
		}
	})
}

// TestFromRecordRefuses: a recorded cgroup is swept only where
// kc-watchman makes them.
func TestFromRecordRefuses(t *testing.T) {
	id := newID(t)
	other := newID(t)
	unit := UnitName(id)
	for _, tc := range []struct {
		name string
		rec  ledger.Cgroup
	}{
		{"parent dir", ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman"}},
		{"dot dot", ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman/../" + id}},
		{"dot dot below", ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman/" + id + "/.."}},
		{"outside", ledger.Cgroup{Kind: "cgroup2", Path: "system.slice/" + id}},
		{"root", ledger.Cgroup{Kind: "cgroup2", Path: "/"}},
		{"another container's", ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman/" + other}},
		{"nested", ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman/" + id + "/x"}},
		{"unknown kind", ledger.Cgroup{Kind: "cgroup3", Path: "kc-watchman/" + id}},
		{"freezer outside", ledger.Cgroup{Kind: "freezer-v1", Path: "../kc-watchman/" + id}},
		{"scope elsewhere", ledger.Cgroup{Kind: "systemd", Unit: unit, Path: "system.slice/" + unit}},
		{"scope of another unit", ledger.Cgroup{Kind: "systemd", Unit: UnitName(other), Path: SlicePath + "/" + UnitName(other)}},
		{"scope escapes", ledger.Cgroup{Kind: "systemd", Unit: unit, Path: SlicePath + "/../" + unit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := FromRecord(tc.rec, id, Options{}); !errors.Is(err, ErrRefused) {
				t.Errorf("FromRecord(%+v) = %v, want ErrRefused", tc.rec, err)
			}
		})
	}
	if _, err := FromRecord(ledger.Cgroup{Kind: "cgroup2", Path: "kc-watchman/" + id}, "../x", Options{}); !errors.Is(err, ErrBadID) {
		t.Errorf("a bad container ID: %v", err)
	}
}

// TestOpenRefusesSymlinks: each component is opened without following a
// symlink (cgroupfs allows none, so the walk is shown on a plain
// directory, where the filesystem check would refuse it anyway).
func TestOpenRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	fd, err := openMount(dir, KindCgroup2)
	if err == nil {
		t.Fatalf("a tmp dir passed as a cgroup2 mount")
	}
	_ = fd
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := openDirAt(int(d.Fd()), "link", KindCgroup2); !errors.Is(err, errUnsafe) {
		t.Errorf("opening a symlink: %v, want errUnsafe", err)
	}
}

// TestReadMountsPastTheBound: a host that mounted cgroupfs after a
// megabyte of other mounts still has its cgroup v2 hierarchy found; the
// table is read on past mountinfo.Max only for that.
func TestReadMountsPastTheBound(t *testing.T) {
	real, err := readMounts("/proc")
	if err != nil {
		t.Fatal(err)
	}
	v2 := real.cgroup2()
	if v2 == "" {
		t.Skip("no cgroup v2 hierarchy here")
	}
	proc := t.TempDir()
	if err := os.Mkdir(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := 0; b.Len() <= mountinfo.Max; i++ {
		fmt.Fprintf(&b, "%d 1 0:42 / /home/u/m%d rw - fuse.sshfs src rw,user_id=1000\n", 1000+i, i)
	}
	fmt.Fprintf(&b, "999 1 0:26 / %s rw - cgroup2 cgroup2 rw\n", v2)
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ms, err := readMounts(proc)
	if err != nil {
		t.Fatal(err)
	}
	if got := ms.cgroup2(); got != v2 {
		t.Errorf("cgroup2 past the first MiB: %q, want %q", got, v2)
	}
}
