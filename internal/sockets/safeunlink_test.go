package sockets

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// bound leaves a socket file at path with nothing listening.
func bound(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
}

func TestExamineRefusesNonSockets(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "real.sock")
	bound(t, sock)
	setup := map[string]func(p string) error{
		"symlink to a file":   func(p string) error { return os.Symlink(outside, p) },
		"symlink to a socket": func(p string) error { return os.Symlink(sock, p) },
		"regular file":        func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"fifo":                func(p string) error { return unix.Mkfifo(p, 0o600) },
		"directory":           func(p string) error { return os.Mkdir(p, 0o700) },
	}
	for name, mk := range setup {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, "kc-1-"+filepath.Base(t.Name())+".sock")
			if err := mk(p); err != nil {
				t.Fatal(err)
			}
			if _, err := Examine(p); !errors.Is(err, ErrNotSocket) {
				t.Errorf("Examine = %v, want ErrNotSocket", err)
			}
			// Even with a made-up identity, Unlink must refuse.
			if err := Unlink(p, File{}); !errors.Is(err, ErrChanged) || !testutil.PathExists(p) {
				t.Errorf("Unlink = %v; still there: %v", err, testutil.PathExists(p))
			}
		})
	}
	if !testutil.PathExists(outside) || !testutil.PathExists(sock) {
		t.Error("a symlink target was removed")
	}
}

func TestUnlink(t *testing.T) {
	dir := t.TempDir()
	t.Run("the examined socket", func(t *testing.T) {
		p := filepath.Join(dir, "a.sock")
		bound(t, p)
		f, err := Examine(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := Unlink(p, f); err != nil || testutil.PathExists(p) {
			t.Fatalf("Unlink = %v, exists %v", err, testutil.PathExists(p))
		}
		if err := Unlink(p, f); !errors.Is(err, ErrGone) {
			t.Errorf("second Unlink = %v, want ErrGone", err)
		}
	})
	t.Run("swapped for another socket", func(t *testing.T) {
		p := filepath.Join(dir, "b.sock")
		bound(t, p)
		f, _ := Examine(p)
		os.Remove(p)
		bound(t, p)
		if err := Unlink(p, f); !errors.Is(err, ErrChanged) || !testutil.PathExists(p) {
			t.Errorf("Unlink = %v, exists %v", err, testutil.PathExists(p))
		}
	})
	t.Run("same inode, changed since examined", func(t *testing.T) {
		// What a socket unlinked and bound again at once under the same
		// inode number looks like (tmpfs reuses them): only the change
		// time tells.
		p := filepath.Join(dir, "ctime.sock")
		bound(t, p)
		f, err := Examine(p)
		if err != nil {
			t.Fatal(err)
		}
		f.CtimeNsec++
		if err := Unlink(p, f); !errors.Is(err, ErrChanged) || !testutil.PathExists(p) {
			t.Errorf("Unlink = %v, exists %v; want ErrChanged and kept", err, testutil.PathExists(p))
		}
	})
	t.Run("swapped for a symlink", func(t *testing.T) {
		p := filepath.Join(dir, "c.sock")
		bound(t, p)
		f, _ := Examine(p)
		os.Remove(p)
		target := filepath.Join(dir, "target.sock")
		bound(t, target)
		os.Symlink(target, p)
		if err := Unlink(p, f); !errors.Is(err, ErrChanged) || !testutil.PathExists(target) {
			t.Errorf("Unlink = %v, target exists %v", err, testutil.PathExists(target))
		}
	})
	t.Run("owner changed", func(t *testing.T) {
		p := filepath.Join(dir, "d.sock")
		bound(t, p)
		f, _ := Examine(p)
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Skipf("chown: %v", err)
		}
		if err := Unlink(p, f); !errors.Is(err, ErrChanged) || !testutil.PathExists(p) {
			t.Errorf("Unlink = %v, exists %v", err, testutil.PathExists(p))
		}
	})
	t.Run("parent directory is a symlink", func(t *testing.T) {
		real := filepath.Join(dir, "realdir")
		os.Mkdir(real, 0o700)
		p := filepath.Join(real, "e.sock")
		bound(t, p)
		f, _ := Examine(p)
		link := filepath.Join(dir, "linkdir")
		os.Symlink(real, link)
		if err := Unlink(filepath.Join(link, "e.sock"), f); err == nil || !testutil.PathExists(p) {
			t.Errorf("Unlink through a symlinked directory = %v, exists %v", err, testutil.PathExists(p))
		}
	})
	// A bound path is whatever a process passed to bind(2). Walked from
	// "/", a relative or unclean one leads somewhere its text does not
	// say: each must be refused, even for the right socket.
	t.Run("paths that are not clean and absolute", func(t *testing.T) {
		p := filepath.Join(dir, "f.sock")
		bound(t, p)
		f, err := Examine(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(wd, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{rel, strings.TrimPrefix(p, "/"), dir + "/sub/../f.sock", dir + "//f.sock", dir + "/./f.sock", "/"} {
			if _, err := Examine(q); err == nil {
				t.Errorf("Examine(%q) = nil error", q)
			}
			if err := Unlink(q, f); err == nil || !testutil.PathExists(p) {
				t.Errorf("Unlink(%q) = %v, exists %v", q, err, testutil.PathExists(p))
			}
		}
	})
	t.Run("names that are not file names", func(t *testing.T) {
		d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(d)
		for _, n := range []string{"", ".", "..", "../x.sock", "a/b.sock"} {
			if err := unlinkAt(d, n, File{}); !errors.Is(err, ErrChanged) {
				t.Errorf("unlinkAt(%q) = %v", n, err)
			}
		}
	})
}
