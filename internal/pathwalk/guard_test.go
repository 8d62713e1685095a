package pathwalk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestGuardReadsPastTheFirstMiB: a mount the table does not show, past
// its first 1 MiB or mounted since, has the table read again, whole up
// to 16 MiB, before it is judged: a user's FUSE mount (pushed past the
// first MiB by his own many mounts, or new) is refused, another late or
// new mount is not; one not there at all, or past 16 MiB, is refused as
// new. In a user namespace every FUSE mount is a user's: its user_id is
// counted in its mounter's namespace, and 0 there is no host root. An
// overlay in the caller's own user namespace is not (a container's:
// TestGuardTrustsRootsFileSystemsInAUserNamespace).
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
		{"early FUSE", 0, "", 2, ErrOnFUSE, ""},
		{"late mount", 5000, "", 3, nil, ""},
		{"late FUSE", 5000, "", 2, ErrOnFUSE, ""},
		{"not in the table", 5000, "", 4, ErrNewMount, ""},
		{"past 16 MiB", 70000, "", 3, ErrNewMount, ""},
		{"mounted since", 0, line(5, "/run/user/1002", "tmpfs", "rw"), 5, nil, ""},
		{"FUSE mounted since", 0, line(5, "/run/user/1002", "fuse.evil", "rw,user_id=1002,allow_other"), 5, ErrOnFUSE, ""},
		{"not there since either", 0, line(5, "/run/user/1002", "tmpfs", "rw"), 6, ErrNewMount, ""},
		{"FUSE of root", 0, line(5, "/mnt/x", "fuse.sshfs", "rw,user_id=0"), 5, nil, ""},
		{"FUSE of a user namespace's root", 0, line(5, "/mnt/x", "fuse.sshfs", "rw,user_id=0"), 5, ErrOnFUSE, "0 100000 65536\n"},
		{"another mount in a user namespace", 0, "", 3, nil, "0 100000 65536\n"},
		{"an overlay in our own user namespace", 0, line(5, "/", "overlay", "rw,lowerdir=/usr/lib/composefs"), 5, nil, "0 100000 65536\n"},
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
			g := ReadGuard(proc, 0)
			defer g.Close()
			if (tc.past > 0) != (g.err != nil) {
				t.Fatalf("first read: %v", g.err)
			}
			if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(table(tc.past)+tc.since), 0o644); err != nil {
				t.Fatal(err)
			}
			err := g.Mount("/run/user/x", tc.id)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("mount %d: %v, want %v", tc.id, err, tc.want)
			}
		})
	}
}

// TestGuardStaysRefusingOnceStale: once the kernel said the table
// changed and it could not be read again (here: its reads used up), no
// mount is judged by the old table any more, though poll(2) says the
// change only once.
func TestGuardStaysRefusingOnceStale(t *testing.T) {
	base := t.TempDir()
	root := testutil.MountID(t, base)
	g := ReadGuard("/proc", 0)
	defer g.Close()
	if err := g.Mount(base, root); err != nil {
		t.Fatalf("before any change: %v", err)
	}
	g.table.budget = 0
	testutil.MountTmpfs(t, base, "changed")
	for i := range 2 {
		// Said as a stale table, which a sweep reports as its failure,
		// not as one user's new mount it passes over.
		if err := g.Mount(base, root); !errors.Is(err, ErrNewMount) || !errors.Is(err, ErrTableStale) {
			t.Errorf("judgment %d after the change: %v, want refused, the table stale", i+1, err)
		}
	}
}

// TestGuardWithoutATableRefuses: where the mount table cannot be read, no
// mount can be judged, and none is taken for root's.
func TestGuardWithoutATableRefuses(t *testing.T) {
	g := ReadGuard(t.TempDir(), 0) // no self/mountinfo there
	defer g.Close()
	if g.err == nil {
		t.Fatal("a table was read from an empty procfs")
	}
	if err := g.Mount("/tmp", 27); !errors.Is(err, ErrNewMount) {
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
	g := ReadGuard(proc, 7)
	defer g.Close()
	for _, tc := range []struct {
		name string
		id   uint64
		want error
	}{
		{"root's overlay, bind-mounted in", 10, nil},
		{"an overlay the namespace made", 11, ErrOnFUSE},
		{"root's FUSE (lxcfs)", 12, nil},
		{"a user's FUSE from the host", 13, ErrOnFUSE},
		{"a FUSE mount the namespace made", 14, ErrOnFUSE},
	} {
		err := g.Mount("/x", tc.id)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s (mount %d): %v, want %v", tc.name, tc.id, err, tc.want)
		}
	}
}

// TestGuardRefusesWithoutATable: the zero Guard, and one closed, can no
// longer tell a mount from a user's FUSE mount that took its ID: every
// mount is refused, none let through.
func TestGuardRefusesWithoutATable(t *testing.T) {
	base := t.TempDir()
	id := testutil.MountID(t, base)
	closed := ReadGuard("/proc", 0)
	if err := closed.Mount(base, id); err != nil {
		t.Fatalf("before Close: %v", err)
	}
	closed.Close()
	for name, g := range map[string]Guard{"zero": {}, "closed": closed} {
		if err := g.Mount(base, id); !errors.Is(err, ErrNewMount) {
			t.Errorf("%s guard: mount %d: %v, want refused", name, id, err)
		}
	}
}
