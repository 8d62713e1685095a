package sockets

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestUnlinkAt(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fd := int(d.Fd())
	classify := func(name string) File {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
		return File{Dev: st.Dev, Ino: st.Ino, UID: int(st.Uid)}
	}
	orphanSocket := testutil.OrphanSocket
	exists := func(p string) bool {
		_, err := os.Lstat(p)
		return err == nil
	}

	t.Run("same socket", func(t *testing.T) {
		p := orphanSocket(t, dir, "kc-10.sock")
		if err := UnlinkAt(fd, "kc-10.sock", classify("kc-10.sock")); err != nil || exists(p) {
			t.Fatalf("err %v exists %v", err, exists(p))
		}
	})
	t.Run("swapped for another inode", func(t *testing.T) {
		p := orphanSocket(t, dir, "kc-11.sock")
		id := classify("kc-11.sock")
		other := orphanSocket(t, dir, "kc-12.sock")
		if err := os.Rename(other, p); err != nil {
			t.Fatal(err)
		}
		err := UnlinkAt(fd, "kc-11.sock", id)
		if !errors.Is(err, ErrChanged) || !exists(p) {
			t.Fatalf("err %v exists %v", err, exists(p))
		}
	})
	t.Run("swapped for a symlink", func(t *testing.T) {
		p := orphanSocket(t, dir, "kc-13.sock")
		id := classify("kc-13.sock")
		target := orphanSocket(t, t.TempDir(), "kc-14.sock")
		os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		err := UnlinkAt(fd, "kc-13.sock", id)
		if !errors.Is(err, ErrChanged) || !exists(p) || !exists(target) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("owner changed", func(t *testing.T) {
		p := orphanSocket(t, dir, "kc-15.sock")
		id := classify("kc-15.sock")
		os.Lchown(p, 65534, 65534)
		if err := UnlinkAt(fd, "kc-15.sock", id); !errors.Is(err, ErrChanged) || !exists(p) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("gone", func(t *testing.T) {
		p := orphanSocket(t, dir, "kc-16.sock")
		id := classify("kc-16.sock")
		os.Remove(p)
		if err := UnlinkAt(fd, "kc-16.sock", id); !errors.Is(err, ErrGone) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("bad names", func(t *testing.T) {
		for _, n := range []string{"../kc-1.sock", "kc-../../etc.sock", "x/kc-1.sock", "passwd"} {
			if err := UnlinkAt(fd, n, File{}); !errors.Is(err, ErrBadName) {
				t.Errorf("%q: err %v", n, err)
			}
		}
	})
}
