package trust

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// tree builds, under a fresh 0755 root-owned dir, what each case names:
// dirs (with modes), files and symlinks, then walks it.
type entry struct {
	path   string
	mode   os.FileMode // 0: a symlink to link
	link   string
	dir    bool
	uid    int // 0: the test's own user
	sticky bool
}

func build(t *testing.T, base string, es []entry) {
	t.Helper()
	for _, e := range es {
		p := filepath.Join(base, e.path)
		var err error
		switch {
		case strings.HasPrefix(e.link, "="):
			err = os.Link(filepath.Join(base, e.link[1:]), p)
		case strings.HasPrefix(e.link, "@"):
			err = os.Symlink(base+e.link[1:], p)
		case e.link != "":
			err = os.Symlink(e.link, p)
		case e.dir:
			err = os.Mkdir(p, 0o755)
		default:
			err = os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.uid != 0 {
			if err := os.Lchown(p, e.uid, e.uid); err != nil {
				t.Fatal(err)
			}
		}
		if e.link != "" {
			continue
		}
		mode := e.mode
		if e.sticky {
			mode |= os.ModeSticky
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPath(t *testing.T) {
	euid := uint32(os.Geteuid())
	tests := []struct {
		name     string
		tree     []entry
		path     string // under the case's base dir
		kind     uint32
		owners   []uint32
		resolved string // under base; "" means path itself
		refused  bool   // ErrUntrusted
		failed   bool   // another error
	}{
		{name: "root's file in root's dirs", tree: []entry{{path: "bin", dir: true, mode: 0o755}, {path: "bin/kc-hook", mode: 0o755}}, path: "bin/kc-hook"},
		{name: "file group writable", tree: []entry{{path: "kc-hook", mode: 0o775}}, path: "kc-hook", refused: true},
		{name: "file world writable", tree: []entry{{path: "kc-hook", mode: 0o757}}, path: "kc-hook", refused: true},
		{name: "file another user's", tree: []entry{{path: "kc-hook", mode: 0o755, uid: 65534}}, path: "kc-hook", refused: true},
		{name: "file of a trusted second owner", tree: []entry{{path: "kc-hook", mode: 0o755, uid: 65534}}, path: "kc-hook", owners: []uint32{euid, 65534}},
		{name: "dir above another user's", tree: []entry{{path: "bin", dir: true, mode: 0o755, uid: 65534}, {path: "bin/kc-hook", mode: 0o755}}, path: "bin/kc-hook", refused: true},
		{name: "dir above group writable", tree: []entry{{path: "bin", dir: true, mode: 0o775}, {path: "bin/kc-hook", mode: 0o755}}, path: "bin/kc-hook", refused: true},
		{name: "dir above world writable", tree: []entry{{path: "bin", dir: true, mode: 0o777}, {path: "bin/kc-hook", mode: 0o755}}, path: "bin/kc-hook", refused: true},
		{name: "dir above world writable and sticky", tree: []entry{{path: "tmp", dir: true, mode: 0o777, sticky: true}, {path: "tmp/kc-hook", mode: 0o755}}, path: "tmp/kc-hook"},
		{name: "dir above group writable and sticky", tree: []entry{{path: "tmp", dir: true, mode: 0o775, sticky: true}, {path: "tmp/kc-hook", mode: 0o755}}, path: "tmp/kc-hook"},
		{name: "sticky file is no dir", tree: []entry{{path: "kc-hook", mode: 0o777, sticky: true}}, path: "kc-hook", refused: true},
		{name: "symlinked dir, as /usr/local on CoreOS", tree: []entry{
			{path: "var", dir: true, mode: 0o755}, {path: "var/usrlocal", dir: true, mode: 0o755}, {path: "var/usrlocal/kc-hook", mode: 0o755},
			{path: "local", link: "var/usrlocal"},
		}, path: "local/kc-hook", resolved: "var/usrlocal/kc-hook"},
		{name: "symlink leading through a writable dir", tree: []entry{
			{path: "open", dir: true, mode: 0o777}, {path: "open/real", dir: true, mode: 0o755}, {path: "open/real/kc-hook", mode: 0o755},
			{path: "local", link: "open/real"},
		}, path: "local/kc-hook", refused: true},
		{name: "symlink via a link in a writable dir it does not end in", tree: []entry{
			{path: "open", dir: true, mode: 0o777}, {path: "real", dir: true, mode: 0o755}, {path: "real/kc-hook", mode: 0o755},
			{path: "open/hop", link: "../real"}, {path: "local", link: "open/hop"},
		}, path: "local/kc-hook", refused: true},
		{name: "symlink in a writable dir", tree: []entry{
			{path: "open", dir: true, mode: 0o777}, {path: "kc-hook.real", mode: 0o755}, {path: "open/kc-hook", link: "../kc-hook.real"},
		}, path: "open/kc-hook", refused: true},
		{name: "another user's symlink in a sticky dir", tree: []entry{
			{path: "tmp", dir: true, mode: 0o777, sticky: true}, {path: "kc-hook.real", mode: 0o755}, {path: "tmp/kc-hook", link: "../kc-hook.real", uid: 65534},
		}, path: "tmp/kc-hook", refused: true},
		{name: "root's symlink in a sticky dir", tree: []entry{
			{path: "tmp", dir: true, mode: 0o777, sticky: true}, {path: "kc-hook.real", mode: 0o755}, {path: "tmp/kc-hook", link: "../kc-hook.real"},
		}, path: "tmp/kc-hook", resolved: "kc-hook.real"},
		{name: "file symlink to a trusted file", tree: []entry{
			{path: "kc-hook.real", mode: 0o755}, {path: "kc-hook", link: "kc-hook.real"},
		}, path: "kc-hook", resolved: "kc-hook.real"},
		{name: "symlink with .. taken from where it led", tree: []entry{
			{path: "a", dir: true, mode: 0o755}, {path: "a/b", dir: true, mode: 0o755}, {path: "a/kc-hook", mode: 0o755},
			{path: "x", link: "a/b/../kc-hook"},
		}, path: "x", resolved: "a/kc-hook"},
		{name: "symlink loop", tree: []entry{{path: "l1", link: "l2"}, {path: "l2", link: "l1"}}, path: "l1/kc-hook", failed: true},
		{name: "missing", path: "kc-hook", failed: true},
		{name: "dir, not a file", tree: []entry{{path: "kc-hook", dir: true, mode: 0o755}}, path: "kc-hook", refused: true},
		{name: "file wanted as a dir", tree: []entry{{path: "f", mode: 0o644}}, path: "f", kind: unix.S_IFDIR, refused: true},
		{name: "untidy, .. taken from where the walk stands", tree: []entry{{path: "bin", dir: true, mode: 0o755}, {path: "kc-hook", mode: 0o755}}, path: "bin/..//kc-hook", resolved: "kc-hook"},
		{name: "absolute target", tree: []entry{{path: "kc-hook.real", mode: 0o755}, {path: "kc-hook", link: "@/kc-hook.real"}}, path: "kc-hook", resolved: "kc-hook.real"},
		{name: "target ending in ..", tree: []entry{{path: "a", dir: true, mode: 0o755}, {path: "a/b", dir: true, mode: 0o755}, {path: "kc-hook", mode: 0o755}, {path: "up", link: "a/b/../.."}}, path: "up/kc-hook", resolved: "kc-hook"},
		{name: "another user's file hard-linked into a sticky dir", tree: []entry{
			{path: "tmp", dir: true, mode: 0o777, sticky: true}, {path: "kc-hook.real", mode: 0o755}, {path: "tmp/kc-hook", link: "=kc-hook.real"},
		}, path: "tmp/kc-hook", refused: true},
		{name: "a hard link in a dir closed to others", tree: []entry{
			{path: "bin", dir: true, mode: 0o755}, {path: "kc-hook.real", mode: 0o755}, {path: "bin/kc-hook", link: "=kc-hook.real"},
		}, path: "bin/kc-hook"},
		{name: "more links than the kernel follows", tree: chain(41), path: "l0", failed: true},
		{name: "as many links as the kernel follows", tree: chain(40), path: "l0", resolved: "kc-hook"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range tc.tree {
				if e.uid != 0 && euid != 0 {
					t.Skip("needs root: it gives a file to another user")
				}
			}
			base := t.TempDir()
			if err := os.Chmod(base, 0o755); err != nil {
				t.Fatal(err)
			}
			build(t, base, tc.tree)
			kind, owners := tc.kind, tc.owners
			if kind == 0 {
				kind = unix.S_IFREG
			}
			if owners == nil {
				owners = []uint32{0, euid}
			}
			// Not filepath.Join, which would clean the "not clean" case.
			got, err := Path(base+"/"+tc.path, kind, owners...)
			switch {
			case tc.refused && !errors.Is(err, ErrUntrusted):
				t.Fatalf("Path = %q, %v; want it refused", got, err)
			case tc.failed && (err == nil || errors.Is(err, ErrUntrusted)):
				t.Fatalf("Path = %q, %v; want an error other than refusal", got, err)
			case tc.refused || tc.failed:
				return
			case err != nil:
				t.Fatalf("Path: %v", err)
			}
			want := filepath.Join(base, tc.path)
			if tc.resolved != "" {
				want = filepath.Join(base, tc.resolved)
			}
			if got != want {
				t.Errorf("Path = %q, want %q", got, want)
			}
		})
	}
	t.Run("a link in /proc", func(t *testing.T) {
		// /proc/self/root/x names this process's root, wherever it is,
		// not /x.
		if _, err := Path("/proc/self/root/bin/sh", unix.S_IFREG, 0, euid); !errors.Is(err, ErrUntrusted) {
			t.Errorf("Path(/proc/self/root/bin/sh) = %v, want it refused", err)
		}
	})
	t.Run(".. above /", func(t *testing.T) {
		got, err := Path("/../../bin/../bin", unix.S_IFDIR, 0, euid)
		want, _ := filepath.EvalSymlinks("/bin")
		if err != nil || got != want {
			t.Errorf("Path = %q, %v; want %q", got, err, want)
		}
	})
	t.Run("relative", func(t *testing.T) {
		if _, err := Path("bin/kc-hook", unix.S_IFREG, 0); !errors.Is(err, ErrUntrusted) {
			t.Errorf("Path(relative) = %v, want it refused", err)
		}
	})
}

// chain is n symlinks l0 -> l1 -> … -> kc-hook.
func chain(n int) []entry {
	es := []entry{{path: "kc-hook", mode: 0o755}}
	for i := n - 1; i >= 0; i-- {
		to := "kc-hook"
		if i < n-1 {
			to = "l" + strconv.Itoa(i+1)
		}
		es = append(es, entry{path: "l" + strconv.Itoa(i), link: to})
	}
	return es
}
