package pathwalk

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestWalk: the component walk resolves as the kernel would where it
// may (relative and absolute symlinks, "..", /proc's own links), keeps a
// container's paths inside its root, and refuses what it must not
// follow.
func TestWalk(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, rel string) {
		if err := os.Symlink(target, filepath.Join(root, rel)); err != nil {
			t.Fatal(err)
		}
	}
	mk("a/b/c")
	mk("x")
	link("../b", "a/b/up")           // relative, through ".."
	link("/a/b", "x/abs")            // absolute: inside root only in a container
	link("loop", "x/loop")           // itself
	link(root+"/a/b/c", "x/hostabs") // absolute on the host
	if err := os.WriteFile(filepath.Join(root, "x", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat("/d", maxDepth+1)
	mk(deep)

	ino := func(p string) uint64 {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	self := "/proc/" + strconv.Itoa(os.Getpid()) + "/root"
	tests := []struct {
		name  string
		w     Walk
		inner string // host: under root; container: inside root
		host  bool   // walked from the host's "/"
		want  string // directory reached, under root; "" when refused
		err   error
	}{
		{"plain", Walk{Follow: true}, "/a/b/c", false, "a/b/c", nil},
		{"dot-dot at the root stays", Walk{Follow: true, InRoot: true}, "/../../a", false, "a", nil},
		{"relative symlink with ..", Walk{Follow: true, FollowLast: true}, "/a/b/up/c", false, "a/b/c", nil},
		{"absolute symlink stays in the root", Walk{Follow: true, InRoot: true}, "/x/abs/c", false, "a/b/c", nil},
		{"absolute symlink on the host", Walk{Follow: true}, root + "/x/hostabs", true, "", unix.ENOTDIR},
		{"absolute symlink on the host, followed last", Walk{Follow: true, FollowLast: true}, root + "/x/hostabs", true, "a/b/c", nil},
		{"/proc's links on the host", Walk{Follow: true, FollowLast: true}, self + root + "/a", true, "a", nil},
		{"/proc's links in a container", Walk{Follow: true, FollowLast: true, InRoot: true}, "/proc/self/root/a", true, "", ErrProcLinkInRoot},
		{"symlink loop", Walk{Follow: true, FollowLast: true}, "/x/loop", false, "", unix.ELOOP},
		{"symlink without follow", Walk{}, "/a/b/up/c", false, "", ErrSymlink},
		{"missing", Walk{Follow: true}, "/a/nope/c", false, "", unix.ENOENT},
		{"a file on the way", Walk{Follow: true}, "/x/f/c", false, "", unix.ENOTDIR},
		{"too deep", Walk{Follow: true}, deep, false, "", unix.ENAMETOOLONG},
	}
	g := ReadGuard("/proc", 0)
	defer g.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.w.Guard = g
			base := root
			if tt.host {
				base = "/"
			}
			bfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(bfd)
			fd, err := tt.w.Open(bfd, tt.inner)
			if fd >= 0 {
				defer unix.Close(fd)
			}
			switch {
			case tt.err != nil && !errors.Is(err, tt.err):
				t.Fatalf("open(%s): %v, want %v", tt.inner, err, tt.err)
			case tt.err == nil && err != nil:
				t.Fatalf("open(%s): %v", tt.inner, err)
			case tt.err != nil:
				return
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				t.Fatal(err)
			}
			if want := ino(filepath.Join(root, tt.want)); st.Ino != want {
				t.Errorf("open(%s) reached inode %d, want %s (%d)", tt.inner, st.Ino, tt.want, want)
			}
		})
	}
}

// TestWalkJudgesEveryMount: the walk judges the mount of every directory
// it looks into, the base first (a container's root may be a user's FUSE
// mount), then each mount it crosses, by the guard's table.
func TestWalkJudgesEveryMount(t *testing.T) {
	base := t.TempDir()
	sub := testutil.MountTmpfs(t, base, "sub")
	if err := os.Mkdir(filepath.Join(sub, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	outer, inner := testutil.MountID(t, base), testutil.MountID(t, sub)
	// A table file that never changes: the guard is what the test says.
	table := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(table, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	guard := func(ids map[uint64]int) Guard {
		f, err := mountinfo.Open(table)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return Guard{points: map[string]int{}, ids: ids, table: &heldTable{f: f, whole: true}}
	}
	for _, tc := range []struct {
		name string
		ids  map[uint64]int
		want error
	}{
		{"both root's", map[uint64]int{outer: 0, inner: 0}, nil},
		{"the base a user's FUSE mount", map[uint64]int{outer: 1000, inner: 0}, ErrOnFUSE},
		{"the base not in the table", map[uint64]int{inner: 0}, ErrNewMount},
		{"a crossed mount a user's", map[uint64]int{outer: 0, inner: 1000}, ErrOnFUSE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(bfd)
			fd, err := Walk{Guard: guard(tc.ids), Follow: true}.Open(bfd, "/sub/x")
			if fd >= 0 {
				unix.Close(fd)
			}
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("open: %v, want %v", err, tc.want)
			}
		})
	}
}
