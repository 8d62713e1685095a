package mountinfo

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRead(t *testing.T) {
	id := 35
	line := func(point, fstype, super string) string {
		id++
		return strconv.Itoa(id) + " 35 0:31 / " + point + " rw,nosuid shared:1 - " + fstype + " src " + super + "\n"
	}
	table := line("/sys/fs/cgroup", "cgroup2", "rw,nsdelegate") +
		line(`/home/u/with\040space\134`, "fuse.sshfs", "rw,user_id=1000,group_id=1000") +
		"garbage\n" +
		line("/mnt/blk", "fuseblk", "rw,user_id=0,group_id=0") +
		line("/run/odd", "fuse", "rw")
	dir := t.TempDir()
	p := filepath.Join(dir, "mountinfo")
	if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	ms, err := Read(p)
	if err != nil || len(ms) != 4 {
		t.Fatalf("Read = %v, %v; want 4 mounts", ms, err)
	}
	for i, tc := range []struct {
		point string
		uid   int
		fuse  bool
	}{
		{"/sys/fs/cgroup", 0, false},
		{`/home/u/with space\`, 1000, true},
		{"/mnt/blk", 0, true},
		{"/run/odd", -1, true}, // no user_id: nobody's, so never root's
	} {
		uid, fuse := ms[i].FUSEUser()
		if want := uint64(36 + i); ms[i].ID != want {
			t.Errorf("mount %d: ID %d, want %d", i, ms[i].ID, want)
		}
		if ms[i].Point != tc.point || uid != tc.uid || fuse != tc.fuse {
			t.Errorf("mount %d: %q FUSEUser %d %v; want %q %d %v", i, ms[i].Point, uid, fuse, tc.point, tc.uid, tc.fuse)
		}
	}

	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat(line("/x", "tmpfs", "rw"), Max/40+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if ms, err := Read(big); !errors.Is(err, ErrTruncated) || len(ms) == 0 {
		t.Errorf("a table past Max: %d mounts, %v; want those read and ErrTruncated", len(ms), err)
	}
	if _, err := Read("/proc/self/mountinfo"); err != nil && !errors.Is(err, ErrTruncated) {
		t.Errorf("this process's table: %v", err)
	}

	// ReadFor reads on past Max only for what the first Max lacks.
	late := filepath.Join(dir, "late")
	if err := os.WriteFile(late, []byte(strings.Repeat(line("/x", "tmpfs", "rw"), Max/40+1)+line("/sys/fs/cgroup", "cgroup2", "rw")), 0o644); err != nil {
		t.Fatal(err)
	}
	isCgroup := func(m Mount) bool { return m.FSType == "cgroup2" }
	for _, tc := range []struct {
		path string
		want func(Mount) bool
		cgv2 bool // the cgroup2 line is among the mounts read
		err  error
	}{
		{late, isCgroup, true, nil},
		{late, func(m Mount) bool { return m.Point == "/x" }, false, ErrTruncated},
		{p, isCgroup, true, nil},
	} {
		ms, err := ReadFor(tc.path, tc.want)
		if got := slices.ContainsFunc(ms, isCgroup); got != tc.cgv2 || !errors.Is(err, tc.err) {
			t.Errorf("ReadFor(%s): cgroup2 read %v, %v; want %v, %v", filepath.Base(tc.path), got, err, tc.cgv2, tc.err)
		}
	}
}

// TestTableChanged: a mount added after the table was opened is reported
// once, by Changed, and shown by the next Read; with the runtime's own
// poller at work (other goroutines waiting on the network), which must
// not take the kernel's report first.
func TestTableChanged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount")
	}
	tb, err := Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // keeps the netpoller waiting
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	for i := range 3 {
		if _, err := tb.Read(Max); err != nil {
			t.Fatal(err)
		}
		// Whatever else the host mounted meanwhile is taken now.
		if _, err := tb.Changed(); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=64k"); err != nil {
			t.Skipf("cannot mount a tmpfs: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
		if changed, err := tb.Changed(); err != nil || !changed {
			t.Fatalf("round %d: changed %v (%v) after a mount", i, changed, err)
		}
		ms, err := tb.Read(Max)
		if err != nil || !slices.ContainsFunc(ms, func(m Mount) bool { return m.Point == p }) {
			t.Fatalf("round %d: the table read again does not show %s (%v)", i, p, err)
		}
	}
}
