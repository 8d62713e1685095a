package sweep

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestPathPinner: a listening socket named by path is pinned and reached
// through the pin: by its path, through a symlinked directory (as
// connect would), and as the sweep reports a container's socket
// (/proc/<pid>/root/..., here our own). A symlink to it and a regular
// file are refused; so are unserved FUSE mounts of another user's, at the
// socket's name or anywhere on the way, with or without a symlink to
// them, whether the mount table showed them or they were mounted after
// it was read: with allow_other and default_permissions any lookup in
// one asks its server, which never answers, and Pin must not wait;
// without allow_other root's stat fails (EACCES), and it is still a
// mount.
func TestPathPinner(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	symlink := func(target, name string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := symlink(live, "link.sock")
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dirLink := symlink(dir, "d")
	relLink := symlink("../"+filepath.Base(filepath.Dir(dirLink))+"/d", "r")
	fuseDir := testutil.OpenTempDir(t, "kcpin", 0o755)
	known := testutil.MountFUSE(t, fuseDir, "kc-1.sock", "allow_other,default_permissions")
	private := testutil.MountFUSE(t, fuseDir, "kc-2.sock", "")

	pp := NewPathPinner("/proc")
	defer pp.Close()
	self := "/proc/" + strconv.Itoa(os.Getpid()) + "/root"
	for _, p := range []string{live, self + live} { // the tables are read now
		pin, err := pp.Pin(p)
		if err != nil {
			t.Fatalf("Pin(%s): %v", p, err)
		}
		pin.Release()
	}
	late := testutil.MountFUSE(t, fuseDir, "late", "allow_other,default_permissions")
	latePrivate := testutil.MountFUSE(t, fuseDir, "late-private", "")
	lateName := testutil.MountFUSE(t, fuseDir, "kc-4.sock", "allow_other,default_permissions")
	lateLink := symlink(late, "l")
	fuseLink := symlink(fuseDir, "f") // no path the table shows a mount under

	tests := []struct {
		name string
		path string
		ok   bool  // pinned, and it connects
		want error // refused with this, or with any error when nil
	}{
		{"socket", live, true, nil},
		{"through a symlinked directory", filepath.Join(dirLink, "live.sock"), true, nil},
		{"through a relative symlink with ..", filepath.Join(relLink, "live.sock"), true, nil},
		{"a container's, as the sweep reports it", self + live, true, nil},
		{"a container's, through a symlink in it", self + filepath.Join(dirLink, "live.sock"), true, nil},
		{"symlink to it", link, false, sockets.ErrNotSocket},
		{"regular file", file, false, sockets.ErrNotSocket},
		{"FUSE mount at the name", known, false, pathwalk.ErrOnFUSE},
		{"FUSE mount root may not stat, at the name", private, false, pathwalk.ErrOnFUSE},
		{"FUSE mount made since at the name", lateName, false, pathwalk.ErrOnFUSE},
		{"the same through a symlink: a mount point", filepath.Join(fuseLink, filepath.Base(lateName)), false, sockets.ErrChanged},
		{"under a FUSE mount the table shows", filepath.Join(known, "sub", "kc-3.sock"), false, pathwalk.ErrOnFUSE},
		{"under a FUSE mount made since", filepath.Join(late, "sub", "kc-3.sock"), false, pathwalk.ErrOnFUSE},
		{"under one root may not stat, made since", filepath.Join(latePrivate, "kc-3.sock"), false, pathwalk.ErrOnFUSE},
		{"through a symlink to a FUSE mount made since", filepath.Join(lateLink, "kc-3.sock"), false, pathwalk.ErrOnFUSE},
		{"a container's, under a FUSE mount made since", self + filepath.Join(late, "kc-3.sock"), false, pathwalk.ErrOnFUSE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type pinned struct {
				err  error
				dial error
			}
			r := testutil.Within(t, held, "Pin", func() pinned {
				p, err := pp.Pin(tt.path)
				r := pinned{err: err}
				if err == nil {
					c, err := net.DialTimeout("unix", p.Path, time.Second)
					if err == nil {
						c.Close()
					}
					r.dial = err
					p.Release()
				}
				return r
			})
			switch {
			case tt.ok && (r.err != nil || r.dial != nil):
				t.Errorf("Pin: %v; dial through it: %v", r.err, r.dial)
			case !tt.ok && r.err == nil:
				t.Errorf("pinned %s, want it refused", tt.path)
			case !tt.ok && tt.want != nil && !errors.Is(r.err, tt.want):
				t.Errorf("Pin: %v, want %v", r.err, tt.want)
			}
		})
	}
}
