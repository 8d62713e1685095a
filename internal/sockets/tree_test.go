package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// listen binds a listening socket at path for the test's duration.
func listen(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// removeOne is RemoveTreeSockets for one socket.
func removeOne(s TreeSocket, sh *Shared) error { return RemoveTreeSockets([]TreeSocket{s}, sh)[0] }

// shares are the ways a decision reads the tables: on its own, and
// shared with other reaps (one Shared a decision, made by mk).
var shares = []struct {
	name string
	mk   func() *Shared
}{
	{"own tables", func() *Shared { return nil }},
	{"shared tables", NewShared},
}

// TestTreeSocketsRefusesWhatItCannotVouchFor: the test process plays the
// tree's only member and binds sockets whose paths it chose, as a
// supervisor's kernel running user code could. The tables read on their
// own or shared with other reaps, the same is refused.
func TestTreeSocketsRefusesWhatItCannotVouchFor(t *testing.T) {
	for _, sv := range shares {
		t.Run(sv.name, func(t *testing.T) { testTreeSocketsRefuse(t, sv.mk) })
	}
}

func testTreeSocketsRefuse(t *testing.T, mk func() *Shared) {
	// One Shared a decision: each lookup below is one.
	decision := func(t *testing.T) *Shared {
		sh := mk()
		t.Cleanup(sh.Close)
		return sh
	}
	me, err := fingerprint.Read("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	own := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", me.PID))
	session := filepath.Join(dir, fmt.Sprintf("kc-%d.abcd1234.sock", me.PID))
	listen(t, own)
	listen(t, session)

	// Not this member's names, not this tree's owner, not reachable
	// without a symlink.
	listen(t, filepath.Join(dir, "kc-1.sock"))
	listen(t, filepath.Join(dir, fmt.Sprintf("kc-%d0.sock", me.PID)))
	listen(t, filepath.Join(dir, "other.sock"))
	chowned := filepath.Join(t.TempDir(), fmt.Sprintf("kc-%d.sock", me.PID))
	listen(t, chowned)
	if err := os.Lchown(chowned, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	listen(t, filepath.Join(link, fmt.Sprintf("kc-%d.x.sock", me.PID)))

	var got []string
	for _, s := range TreeSockets("/proc", me.UID, []int{me.PID}, decision(t)) {
		got = append(got, s.Path)
	}
	slices.Sort(got)
	want := []string{session, own}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("TreeSockets = %q, want %q", got, want)
	}

	t.Run("a listening socket is never removed", func(t *testing.T) {
		sh := decision(t)
		socks := TreeSockets("/proc", me.UID, []int{me.PID}, sh)
		if len(socks) == 0 {
			t.Fatal("no sockets")
		}
		if err := removeOne(socks[0], sh); !errors.Is(err, ErrStillListening) {
			t.Errorf("RemoveTreeSockets on a live socket = %v, want ErrStillListening", err)
		}
		if _, err := os.Lstat(socks[0].Path); err != nil {
			t.Errorf("live socket removed: %v", err)
		}
	})

	t.Run("a dead socket is removed", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), fmt.Sprintf("kc-%d.dead.sock", me.PID))
		l := listen(t, p)
		var target TreeSocket
		sh := decision(t)
		for _, s := range TreeSockets("/proc", me.UID, []int{me.PID}, sh) {
			if s.Path == p {
				target = s
			}
		}
		if target.Path == "" {
			t.Fatal("socket not found")
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		if err := removeOne(target, sh); err != nil {
			t.Fatalf("RemoveSocket = %v", err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("dead socket still there: %v", err)
		}
		// A second time it is already gone: done, not an error to warn of.
		if err := removeOne(target, sh); err != nil {
			t.Errorf("RemoveTreeSockets of a socket already gone = %v, want nil", err)
		}
	})

	t.Run("each socket gets its own answer", func(t *testing.T) {
		dir := t.TempDir()
		live := filepath.Join(dir, fmt.Sprintf("kc-%d.live.sock", me.PID))
		dead := filepath.Join(dir, fmt.Sprintf("kc-%d.gone.sock", me.PID))
		listen(t, live)
		l := listen(t, dead)
		var batch []TreeSocket
		sh := decision(t)
		for _, s := range TreeSockets("/proc", me.UID, []int{me.PID}, sh) {
			if s.Path == live || s.Path == dead {
				batch = append(batch, s)
			}
		}
		if len(batch) != 2 {
			t.Fatalf("found %d of the 2 sockets", len(batch))
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		errs := RemoveTreeSockets(batch, sh)
		for i, s := range batch {
			want := error(nil)
			if s.Path == live {
				want = ErrStillListening
			}
			if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
				t.Errorf("%s: %v, want %v", s.Path, errs[i], want)
			}
		}
		if !testutil.PathExists(live) || testutil.PathExists(dead) {
			t.Errorf("after the batch: live there %v, dead there %v", testutil.PathExists(live), testutil.PathExists(dead))
		}
	})

	t.Run("a tree of mixed UIDs gets no sockets", func(t *testing.T) {
		if s := TreeSockets("/proc", -1, []int{me.PID}, decision(t)); len(s) != 0 {
			t.Errorf("TreeSockets = %+v", s)
		}
	})
}

func TestPlausiblePath(t *testing.T) {
	tests := []struct {
		path string
		want bool
	}{
		{"/tmp/kc-42.sock", true},
		{"/tmp/kc-42.abcd1234.sock", true},
		{"/tmp/kc-42..sock", false},
		{"/tmp/kc-420.sock", false},
		{"/tmp/kc-4.sock", false},
		// ParseName's rules, as sweep applies them: no padding, no dots in <x>.
		{"/tmp/kc-042.sock", false},
		{"/tmp/kc-42.a.b.sock", false},
		{"tmp/kc-42.sock", false},
		{"/tmp/../etc/kc-42.sock", false},
		{"/tmp//kc-42.sock", false},
		{"/tmp/x\n0: 0 0 10000 1 1 7 /run/user/1/kc-42.sock", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			if got := plausiblePath(tt.path, 42); got != tt.want {
				t.Errorf("plausiblePath(%q) = %v", tt.path, got)
			}
		})
	}
}

// TestBoundSocketsRefusesWhatItCannotVouchFor is the same examination
// through sock_diag alone, the way a rootless podman's hook must find a
// tree's sockets: no descriptor is read, so the path must lead to the very
// file the listener was bound to.
func TestBoundSocketsRefusesWhatItCannotVouchFor(t *testing.T) {
	me, err := fingerprint.Read("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	own := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", me.PID))
	session := filepath.Join(dir, fmt.Sprintf("kc-%d.abcd1234.sock", me.PID))
	listen(t, own)
	listen(t, session)
	listen(t, filepath.Join(dir, "kc-1.sock"))
	listen(t, filepath.Join(dir, fmt.Sprintf("kc-%d0.sock", me.PID)))
	chowned := filepath.Join(t.TempDir(), fmt.Sprintf("kc-%d.sock", me.PID))
	listen(t, chowned)
	if err := os.Lchown(chowned, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	listen(t, filepath.Join(link, fmt.Sprintf("kc-%d.x.sock", me.PID)))

	// A listener whose directory was moved away: its path now names a
	// socket file nobody listens on, which is not the one it bound.
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Mkdir(moved, 0o700); err != nil {
		t.Fatal(err)
	}
	swapped := filepath.Join(moved, fmt.Sprintf("kc-%d.swapped.sock", me.PID))
	listen(t, swapped)
	if err := os.Rename(moved, moved+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(moved, 0o700); err != nil {
		t.Fatal(err)
	}
	decoy := listen(t, swapped)
	decoy.SetUnlinkOnClose(false)
	decoy.Close()

	var got []string
	for _, s := range boundSockets(&reacher{}, []int{me.PID}, me.UID, map[string]bool{}) {
		if s.Owner != me.PID {
			t.Errorf("%s: owner %d, want %d", s.Path, s.Owner, me.PID)
		}
		got = append(got, s.Path)
	}
	slices.Sort(got)
	want := []string{session, own}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("boundSockets = %q, want %q", got, want)
	}
	if s := boundSockets(&reacher{}, []int{me.PID + 1}, me.UID, map[string]bool{}); len(s) != 0 {
		t.Errorf("boundSockets for another PID = %+v", s)
	}
}

// TestTreeSocketOnAUsersFUSEMount: a member may bind its socket inside a
// FUSE mount of its user's, or the user may mount one over a directory on
// the socket's path once it was examined. allow_other lets root's lookups
// reach the server and default_permissions makes even a permission check
// ask it, so any lookup there would wait for ever: the hook's poststop and
// the reap must refuse the path instead, within bounds.
//
// A Shared whose mount table was read before the mounts were made
// (another reap of the same decision) refuses them too: its guard reads
// the table again once the mounts change.
func TestTreeSocketOnAUsersFUSEMount(t *testing.T) {
	const opts = "allow_other,default_permissions"
	const held = 20 * time.Second
	dir := t.TempDir()
	sh := NewShared()
	defer sh.Close()
	if errs := RemoveTreeSockets([]TreeSocket{{Path: filepath.Join(t.TempDir(), "kc-1.sock")}}, sh); errs[0] != nil {
		t.Fatalf("a socket already gone: %v", errs[0])
	}
	fuse := testutil.MountFUSE(t, dir, "fuse", opts)
	later := filepath.Join(dir, "later")
	if err := os.Mkdir(later, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(later, "kc-1.sock")
	bound(t, p)
	examined, err := Examine(p)
	if err != nil {
		t.Fatal(err)
	}
	// The name itself becomes a mount point: the walk passes, and only
	// how the name is dialled tells (connect(2) by name would look it up
	// and ask the server).
	replaced := filepath.Join(dir, "kc-2.sock")
	bound(t, replaced)
	overName, err := Examine(replaced)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(replaced); err != nil {
		t.Fatal(err)
	}
	testutil.MountFUSE(t, dir, "kc-2.sock", opts)
	testutil.MountFUSE(t, dir, "later", opts)
	for _, tc := range []struct {
		name string
		s    TreeSocket
		want error
	}{
		{"in the mount", TreeSocket{Path: filepath.Join(fuse, "kc-1.sock")}, pathwalk.ErrOnFUSE},
		{"under it", TreeSocket{Path: filepath.Join(fuse, "sub", "kc-1.sock")}, pathwalk.ErrOnFUSE},
		{"mounted over its directory since it was examined", TreeSocket{Path: p, File: examined}, pathwalk.ErrOnFUSE},
		{"mounted over its name since it was examined", TreeSocket{Path: replaced, File: overName}, ErrChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := testutil.Within(t, held, "Examine", func() error {
				_, err := Examine(tc.s.Path)
				return err
			})
			if err == nil || (tc.want == pathwalk.ErrOnFUSE && !errors.Is(err, tc.want)) {
				t.Errorf("Examine = %v, want refused", err)
			}
			for _, share := range []*Shared{nil, sh} {
				err = testutil.Within(t, held, "RemoveTreeSockets", func() error { return removeOne(tc.s, share) })
				if !errors.Is(err, tc.want) {
					t.Errorf("RemoveTreeSockets (shared %v) = %v, want %v", share != nil, err, tc.want)
				}
			}
		})
	}
}

// TestSharedReadsEachTableOnce: the reaps of one decision, several at
// once, read the network namespace's socket table once between them and
// each finds its own tree's sockets. A socket bound after the table was
// read is not found by that decision (left for the next, or the sweep),
// and is by the next.
func TestSharedReadsEachTableOnce(t *testing.T) {
	me, err := fingerprint.Read("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const trees = 8
	dir := t.TempDir()
	var paths []string
	for i := range trees {
		p := filepath.Join(dir, fmt.Sprintf("kc-%d.t%d.sock", me.PID, i))
		listen(t, p)
		paths = append(paths, p)
	}
	sh := NewShared()
	defer sh.Close()
	found := make([][]string, trees)
	var wg sync.WaitGroup
	for i := range trees {
		wg.Go(func() {
			for _, s := range TreeSockets("/proc", me.UID, []int{me.PID}, sh) {
				found[i] = append(found[i], s.Path)
			}
		})
	}
	wg.Wait()
	for i, f := range found {
		for _, p := range paths {
			if !slices.Contains(f, p) {
				t.Errorf("reap %d did not find %s (found %q)", i, p, f)
			}
		}
	}
	if sh.netReads != 1 {
		t.Errorf("the socket table was read %d times by %d reaps, want once", sh.netReads, trees)
	}

	late := filepath.Join(dir, fmt.Sprintf("kc-%d.late.sock", me.PID))
	listen(t, late)
	has := func(socks []TreeSocket) bool {
		return slices.ContainsFunc(socks, func(s TreeSocket) bool { return s.Path == late })
	}
	if has(TreeSockets("/proc", me.UID, []int{me.PID}, sh)) {
		t.Errorf("a socket bound after the decision's table was read was found by it")
	}
	next := NewShared()
	defer next.Close()
	if !has(TreeSockets("/proc", me.UID, []int{me.PID}, next)) {
		t.Errorf("the next decision did not find %s", late)
	}
}

// TestSharedGuardServesAFewWalks: a decision's walks share a guard for
// guardUses of them, then read a new one, whose re-read budget is whole
// again; each still judges, as its own guard would.
func TestSharedGuardServesAFewWalks(t *testing.T) {
	sh := NewShared()
	defer sh.Close()
	gone := TreeSocket{Path: filepath.Join(t.TempDir(), "kc-1.sock")}
	const walks = 2*guardUses + 1
	for range walks {
		if err := RemoveTreeSockets([]TreeSocket{gone}, sh)[0]; err != nil {
			t.Fatalf("a socket already gone: %v", err)
		}
	}
	if want := 3; sh.guards != want {
		t.Errorf("%d walks used %d guards, want %d", walks, sh.guards, want)
	}
	sh.Close()
	for i := range guardUses + 1 {
		if err := RemoveTreeSockets([]TreeSocket{gone}, sh)[0]; err == nil {
			t.Fatalf("walk %d after Close was not refused", i+1)
		}
	}
}
