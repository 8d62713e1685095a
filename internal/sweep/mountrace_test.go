package sweep

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// held bounds each call these tests expect an unserved FUSE mount not to
// hold.
const held = 20 * time.Second

// TestMountsAfterTheTableIsRead: a user puts unserved FUSE mounts over
// names after the sweep read the mount table (pathwalk.Guard), which then
// does not know them: over an entry before it is lstat'ed, and over a
// stale socket's name between its listing and its probes and unlink
// (the directories: TestDirsMountedAfterTheTableIsRead).
// allow_other lets root's accesses reach the server and
// default_permissions makes even a permission check ask it, so any
// look at the mount itself would wait for ever. None holds the sweep:
// the entry is a mount point, the socket's name is not dialled, asked or
// unlinked.
func TestMountsAfterTheTableIsRead(t *testing.T) {
	const opts = "allow_other,default_permissions"
	g := pathwalk.ReadGuard("/proc", 0)
	defer g.Close()
	dir := shortTemp(t)
	d, err := openDir(nil, g, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	victim := orphanSocket(t, dir, "kc-2.sock")
	testutil.MountFUSE(t, dir, "kc-1.sock", opts)
	// Without allow_other root's stat of it fails (EACCES): still a
	// mount point, not an unreadable entry.
	testutil.MountFUSE(t, dir, "kc-3.sock", "")

	type scanned struct {
		es  []*entry
		err error
	}
	r := testutil.Within(t, held, "the scan, with a FUSE mount over kc-1.sock", func() scanned {
		es, err := d.scan(g, limits{maxNames, maxOthers, maxEntries}, func(uid int) int { return uid })
		return scanned{es, err}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	byName := map[string]*entry{}
	for _, e := range r.es {
		byName[e.name] = e
	}
	for _, n := range []string{"kc-1.sock", "kc-3.sock"} {
		if e := byName[n]; e == nil || !errors.Is(e.err, errMountPoint) {
			t.Errorf("%s: %+v, want refused as a mount point", n, e)
		}
	}
	e := byName["kc-2.sock"]
	if e == nil || e.err != nil || !e.isSocket() {
		t.Fatalf("kc-2.sock: %+v, want the socket", e)
	}

	// The stale socket's name now has the mount over it.
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	testutil.MountFUSE(t, dir, filepath.Base(victim), opts)
	p := &probe{names: []*Socket{{e: e}}}
	type probed struct {
		dial   error
		status statusTry
		unlink error
	}
	got := testutil.Within(t, held, "probing and unlinking the replaced name", func() probed {
		ctx := context.Background()
		return probed{
			dial:   p.dial(ctx, 200*time.Millisecond),
			status: p.status(ctx, &kallichore.Client{DialTimeout: 200 * time.Millisecond, Timeout: 500 * time.Millisecond}),
			unlink: sockets.UnlinkAt(d.fd, e.name, sockets.File{Dev: e.dev, Ino: e.ino, UID: e.uid}),
		}
	})
	if !errors.Is(got.dial, errReplaced) {
		t.Errorf("dial: %v, want %v", got.dial, errReplaced)
	}
	if say, _ := judgeListen(got.dial, e.innerPath(), e.file(), sockets.NetUnix{}); say != sayUnsure {
		t.Errorf("gate 2 on a replaced name: %v, want unsure", say)
	}
	if !errors.Is(got.status.replaced, errReplaced) {
		t.Errorf("/status: %+v, want not asked, replaced", got.status)
	}
	if say, why := statusGate(2, got.status, got.status); say != sayUnsure {
		t.Errorf("gate 3 on a replaced name: %v (%s), want unsure: two tries not made are no silence", say, why)
	}
	if !errors.Is(got.unlink, sockets.ErrChanged) {
		t.Errorf("unlink: %v, want %v", got.unlink, sockets.ErrChanged)
	}
}

// TestDirsMountedAfterTheTableIsRead: socket directories a user mounts an
// unserved FUSE file system over after the sweep read the mount table:
// given to the sweep (also as the way to one, directly or through a
// symlink), named by a process, and one under such a mount; with
// allow_other, and without (root's stat then fails with EACCES). The
// first mount the table does not show has it read again, which shows
// them as the user's FUSE mounts: each is refused without a look inside
// (opening one for listing would ask its server, and wait for ever),
// which a default or glob directory only warns of. A tmpfs mounted since
// is entered; a FUSE mount made after that second read has the table
// read again (the kernel says it changed), and is refused as a FUSE
// mount too. A directory next to them is opened.
func TestDirsMountedAfterTheTableIsRead(t *testing.T) {
	g := pathwalk.ReadGuard("/proc", 0)
	defer g.Close()
	base := shortTemp(t)
	plain := filepath.Join(base, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	mnt := testutil.MountFUSE(t, base, "mnt", "allow_other,default_permissions")
	private := testutil.MountFUSE(t, base, "private", "")
	tmpfs := testutil.MountTmpfs(t, base, "tmpfs")
	toPlain, toMnt := filepath.Join(base, "to-plain"), filepath.Join(base, "to-mnt")
	if err := os.Symlink("plain", toPlain); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(mnt, toMnt); err != nil {
		t.Fatal(err)
	}
	given := []string{plain, mnt, private, filepath.Join(mnt, "sub"), filepath.Join(private, "sub"), filepath.Join(toMnt, "sub"), toPlain, tmpfs}

	type opened struct {
		given      []*dir
		givenErrs  []error
		discovered [5]error
		later      error
	}
	r := testutil.Within(t, held, "opening the directories", func() opened {
		var r opened
		r.given, r.givenErrs = openDirs(Target{}, g, given)
		for i, p := range []string{mnt, filepath.Join(mnt, "sub"), private, filepath.Join(private, "sub"), plain} {
			d, err := openDiscovered(Target{}, g, p, []int{0})
			if d != nil {
				d.close()
			}
			r.discovered[i] = err
		}
		return r
	})
	later := testutil.MountFUSE(t, base, "later", "allow_other,default_permissions")
	r.later = testutil.Within(t, held, "opening a directory mounted after the table was read again", func() error {
		_, errs := openDirs(Target{}, g, []string{later})
		return errors.Join(errs...)
	})
	var shown []string
	for _, d := range r.given {
		defer d.close()
		shown = append(shown, d.shown)
	}
	// to-plain is plain again: one directory, opened once.
	if want := []string{plain, tmpfs}; !slices.Equal(shown, want) {
		t.Errorf("given: opened %q, want %q", shown, want)
	}
	if len(r.givenErrs) != 5 || slices.ContainsFunc(r.givenErrs, func(err error) bool { return !errors.Is(err, pathwalk.ErrOnFUSE) }) {
		t.Errorf("given: errors %v, want %s refused as FUSE mounts", r.givenErrs, given[1:6])
	}
	for i, err := range r.discovered[:4] {
		if !errors.Is(err, pathwalk.ErrOnFUSE) {
			t.Errorf("discovered %d: %v, want refused as a FUSE mount", i, err)
		}
	}
	if r.discovered[4] != nil {
		t.Errorf("discovered %s: %v", plain, r.discovered[4])
	}
	if !errors.Is(r.later, pathwalk.ErrOnFUSE) {
		t.Errorf("a FUSE mount made after the second read: %v, want refused as a FUSE mount: the table changed, and is read again", r.later)
	}
}

// TestGlobMatchOnFUSEIsNoFailure: --socket-dir '<base>/*' (as
// '/run/user/*') matches a user's FUSE mount among the directories: it
// is refused with a warning, not as a failed directory, and its
// neighbour is swept. A user mounting over his own runtime directory
// must not fail every sweep.
func TestGlobMatchOnFUSEIsNoFailure(t *testing.T) {
	base := shortTemp(t)
	plain := filepath.Join(base, "1000")
	if err := os.Mkdir(plain, 0o700); err != nil {
		t.Fatal(err)
	}
	orphan := orphanSocket(t, plain, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	testutil.MountFUSE(t, base, "1001", "allow_other")

	cfg := fastConfig(filepath.Join(base, "*"))
	cfg.Apply = true
	rep := testutil.Within(t, held, "the sweep", func() *Report {
		rep, _ := Sweep(context.Background(), cfg)
		return rep
	})
	if rep == nil || len(rep.DirErrors) != 0 {
		t.Fatalf("report %+v, want no failed directory", rep)
	}
	if testutil.PathExists(orphan) {
		t.Errorf("the orphan next to the FUSE mount was not unlinked")
	}
}

// TestMountIDReused: a mount the table showed is unmounted after it was
// read, and a user's FUSE mount takes its ID (the kernel hands out the
// lowest free one). The guard must not take the FUSE mount for the one
// the ID was: the kernel says the table changed, and it is read again.
func TestMountIDReused(t *testing.T) {
	base := shortTemp(t)
	gone := testutil.MountTmpfs(t, base, "gone")
	was := testutil.MountID(t, gone)
	g := pathwalk.ReadGuard("/proc", 0)
	defer g.Close()
	if err := unix.Unmount(gone, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	fuse := testutil.MountFUSE(t, base, "fuse", "allow_other,default_permissions")
	if id := testutil.MountID(t, fuse); id != was {
		t.Skipf("the FUSE mount got ID %d, not the freed %d: a mount elsewhere took it", id, was)
	}
	err := testutil.Within(t, held, "opening the FUSE mount", func() error {
		d, err := openDir(nil, g, fuse, false)
		if d != nil {
			d.close()
		}
		return err
	})
	if !errors.Is(err, pathwalk.ErrOnFUSE) {
		t.Errorf("open %s (mount %d, a tmpfs's when the table was read): %v, want refused as a FUSE mount", fuse, was, err)
	}
}
