package sweep

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// held bounds each call these tests expect an unserved FUSE mount not to
// hold.
const held = 20 * time.Second

// TestMountsAfterTheTableIsRead: a user puts unserved FUSE mounts over
// names after the sweep read the mount table (fuseGuard), which then
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
	g := readFUSEGuard("/proc", Target{})
	defer g.close()
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
		es, err := d.scan(g)
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
	if say, _ := judgeListen(got.dial, e.innerPath(), sockets.NetUnix{}); say != sayUnsure {
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
	g := readFUSEGuard("/proc", Target{})
	defer g.close()
	base := shortTemp(t)
	plain := filepath.Join(base, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	mnt := testutil.MountFUSE(t, base, "mnt", "allow_other,default_permissions")
	private := testutil.MountFUSE(t, base, "private", "")
	tmpfs := mountTmpfs(t, base, "tmpfs")
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
	if len(r.givenErrs) != 5 || slices.ContainsFunc(r.givenErrs, func(err error) bool { return !errors.Is(err, errOnFUSE) }) {
		t.Errorf("given: errors %v, want %s refused as FUSE mounts", r.givenErrs, given[1:6])
	}
	for i, err := range r.discovered[:4] {
		if !errors.Is(err, errOnFUSE) {
			t.Errorf("discovered %d: %v, want refused as a FUSE mount", i, err)
		}
	}
	if r.discovered[4] != nil {
		t.Errorf("discovered %s: %v", plain, r.discovered[4])
	}
	if !errors.Is(r.later, errOnFUSE) {
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

// TestGuardReadsPastTheFirstMiB: a mount the table does not show, past
// its first 1 MiB or mounted since, has the table read again, whole up
// to 16 MiB, before it is judged: a user's FUSE mount (pushed past the
// first MiB by his own many mounts, or new) is refused, another late or
// new mount is not; one not there at all, or past 16 MiB, is refused as
// new. In a user namespace every FUSE mount is a user's: its user_id is
// counted in its mounter's namespace, and 0 there is no host root.
func TestGuardReadsPastTheFirstMiB(t *testing.T) {
	line := func(id int, point, fstype, super string) string {
		return fmt.Sprintf("%d 1 0:42 / %s rw - %s src %s\n", id, point, fstype, super)
	}
	pad := func(b *strings.Builder, from, n int) {
		for i := range n {
			b.WriteString(line(from+i, "/home/u/"+strings.Repeat("x", 200)+strconv.Itoa(i), "fuse.sshfs", "rw,user_id=1000"))
		}
	}
	table := func(past int) string {
		var b strings.Builder
		b.WriteString(line(1, "/", "ext4", "rw"))
		pad(&b, 100, past)
		b.WriteString(line(2, "/run/user/1000", "fuse.evil", "rw,user_id=1000,allow_other"))
		b.WriteString(line(3, "/run/user/1001", "tmpfs", "rw"))
		return b.String()
	}
	for _, tc := range []struct {
		name   string
		past   int    // padding lines before mounts 2 and 3, of about 260 bytes
		since  string // lines added after the first read
		id     uint64
		want   error
		uidMap string // default: the initial namespace's
	}{
		{"early mount", 0, "", 3, nil, ""},
		{"early FUSE", 0, "", 2, errOnFUSE, ""},
		{"late mount", 5000, "", 3, nil, ""},
		{"late FUSE", 5000, "", 2, errOnFUSE, ""},
		{"not in the table", 5000, "", 4, errNewMount, ""},
		{"past 16 MiB", 70000, "", 3, errNewMount, ""},
		{"mounted since", 0, line(5, "/run/user/1002", "tmpfs", "rw"), 5, nil, ""},
		{"FUSE mounted since", 0, line(5, "/run/user/1002", "fuse.evil", "rw,user_id=1002,allow_other"), 5, errOnFUSE, ""},
		{"not there since either", 0, line(5, "/run/user/1002", "tmpfs", "rw"), 6, errNewMount, ""},
		{"FUSE of root", 0, line(5, "/mnt/x", "fuse.sshfs", "rw,user_id=0"), 5, nil, ""},
		{"FUSE of a user namespace's root", 0, line(5, "/mnt/x", "fuse.sshfs", "rw,user_id=0"), 5, errOnFUSE, "0 100000 65536\n"},
		{"another mount in a user namespace", 0, "", 3, nil, "0 100000 65536\n"},
		{"an overlay of a user namespace", 0, line(5, "/mnt/o", "overlay", "rw,lowerdir=/home/u/fuse"), 5, errOnFUSE, "0 100000 65536\n"},
		{"an overlay of the host's", 0, line(5, "/mnt/o", "overlay", "rw,lowerdir=/var/lib/x"), 5, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			if err := os.Mkdir(filepath.Join(proc, "self"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(table(tc.past)), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.uidMap == "" {
				tc.uidMap = "0 0 4294967295\n"
			}
			if err := os.WriteFile(filepath.Join(proc, "self", "uid_map"), []byte(tc.uidMap), 0o644); err != nil {
				t.Fatal(err)
			}
			g := readFUSEGuard(proc, Target{})
			defer g.close()
			if (tc.past > 0) != (g.err != nil) {
				t.Fatalf("first read: %v", g.err)
			}
			if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(table(tc.past)+tc.since), 0o644); err != nil {
				t.Fatal(err)
			}
			err := g.mount("/run/user/x", tc.id)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("mount %d: %v, want %v", tc.id, err, tc.want)
			}
		})
	}
}

// TestMountIDReused: a mount the table showed is unmounted after it was
// read, and a user's FUSE mount takes its ID (the kernel hands out the
// lowest free one). The guard must not take the FUSE mount for the one
// the ID was: the kernel says the table changed, and it is read again.
func TestMountIDReused(t *testing.T) {
	base := shortTemp(t)
	gone := mountTmpfs(t, base, "gone")
	was := mountIDOf(t, gone)
	g := readFUSEGuard("/proc", Target{})
	defer g.close()
	if err := unix.Unmount(gone, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	fuse := testutil.MountFUSE(t, base, "fuse", "allow_other,default_permissions")
	if id := mountIDOf(t, fuse); id != was {
		t.Skipf("the FUSE mount got ID %d, not the freed %d: a mount elsewhere took it", id, was)
	}
	err := testutil.Within(t, held, "opening the FUSE mount", func() error {
		d, err := openDir(nil, g, fuse, false)
		if d != nil {
			d.close()
		}
		return err
	})
	if !errors.Is(err, errOnFUSE) {
		t.Errorf("open %s (mount %d, a tmpfs's when the table was read): %v, want refused as a FUSE mount", fuse, was, err)
	}
}

// TestGuardStaysRefusingOnceStale: once the kernel said the table
// changed and it could not be read again (here: its reads used up), no
// mount is judged by the old table any more, though poll(2) says the
// change only once.
func TestGuardStaysRefusingOnceStale(t *testing.T) {
	base := shortTemp(t)
	root := mountIDOf(t, base)
	g := readFUSEGuard("/proc", Target{})
	defer g.close()
	if err := g.mount(base, root); err != nil {
		t.Fatalf("before any change: %v", err)
	}
	g.table.budget = 0
	mountTmpfs(t, base, "changed")
	for i := range 2 {
		if err := g.mount(base, root); !errors.Is(err, errNewMount) {
			t.Errorf("judgment %d after the change: %v, want refused", i+1, err)
		}
	}
}

// TestGuardWithoutATableRefuses: where the mount table cannot be read, no
// mount can be judged, and none is taken for root's.
func TestGuardWithoutATableRefuses(t *testing.T) {
	g := readFUSEGuard(t.TempDir(), Target{}) // no self/mountinfo there
	defer g.close()
	if g.err == nil {
		t.Fatal("a table was read from an empty procfs")
	}
	if err := g.mount("/tmp", 27); !errors.Is(err, errNewMount) {
		t.Errorf("mount 27: %v, want refused", err)
	}
}

// TestGuardTrustsRootsFileSystemsInAUserNamespace: in a target in a user
// namespace, an overlay or a FUSE mount counts as the user's unless our
// own table shows its file system as root's (a userns-remap container's
// overlay root, lxcfs): a mount made inside the namespace never shows in
// ours.
func TestGuardTrustsRootsFileSystemsInAUserNamespace(t *testing.T) {
	proc := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(proc, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	line := func(id int, dev, point, fstype, super string) string {
		return fmt.Sprintf("%d 1 %s / %s rw - %s src %s\n", id, dev, point, fstype, super)
	}
	write("self/uid_map", "0 0 4294967295\n")
	write("self/mountinfo", line(1, "8:1", "/", "ext4", "rw")+
		line(2, "0:50", "/var/lib/docker/overlay2/x/merged", "overlay", "rw,lowerdir=/var/lib/docker/l")+
		line(3, "0:60", "/var/lib/lxcfs", "fuse.lxcfs", "rw,user_id=0")+
		line(4, "0:70", "/home/u/fuse", "fuse.sshfs", "rw,user_id=1000"))
	write("7/uid_map", "0 100000 65536\n")
	write("7/mountinfo", line(10, "0:50", "/", "overlay", "rw,lowerdir=/var/lib/docker/l")+
		line(11, "0:51", "/mnt/own", "overlay", "rw,lowerdir=/home/u/fuse")+
		line(12, "0:60", "/proc/cpuinfo", "fuse.lxcfs", "rw,user_id=0")+
		line(13, "0:70", "/mnt/sshfs", "fuse.sshfs", "rw,user_id=1000")+
		line(14, "0:80", "/mnt/in", "fuse.own", "rw,user_id=0"))
	g := readFUSEGuard(proc, Target{InitPID: 7})
	defer g.close()
	for _, tc := range []struct {
		name string
		id   uint64
		want error
	}{
		{"root's overlay, bind-mounted in", 10, nil},
		{"an overlay the namespace made", 11, errOnFUSE},
		{"root's FUSE (lxcfs)", 12, nil},
		{"a user's FUSE from the host", 13, errOnFUSE},
		{"a FUSE mount the namespace made", 14, errOnFUSE},
	} {
		err := g.mount("/x", tc.id)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s (mount %d): %v, want %v", tc.name, tc.id, err, tc.want)
		}
	}
}
