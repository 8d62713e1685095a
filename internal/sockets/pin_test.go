package sockets

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestPin: a listening socket is pinned and reached through the pin, by
// its path or through a symlinked directory (as connect would); a symlink
// to it, a regular file and unserved FUSE mounts of another user's are
// refused: with allow_other and default_permissions any look inside asks
// its server, which never answers, and Pin must not wait; without
// allow_other root's stat fails (EACCES), and it is still a mount point.
func TestPin(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(live, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(t.TempDir(), "d")
	if err := os.Symlink(dir, dirLink); err != nil {
		t.Fatal(err)
	}
	fuseDir := testutil.OpenTempDir(t, "kcpin", 0o755)
	fuse := testutil.MountFUSE(t, fuseDir, "kc-1.sock", "allow_other,default_permissions")
	private := testutil.MountFUSE(t, fuseDir, "kc-2.sock", "")

	tests := []struct {
		name string
		path string
		ok   bool  // pinned, and it connects
		want error // refused with this, or with any error when nil
	}{
		{"socket", live, true, nil},
		{"symlink to it", link, false, ErrNotSocket},
		{"regular file", file, false, ErrNotSocket},
		{"through a symlinked directory", filepath.Join(dirLink, "live.sock"), true, nil},
		{"FUSE mount", fuse, false, ErrChanged},
		{"FUSE mount root may not stat", private, false, ErrChanged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type pinned struct {
				p    Pinned
				err  error
				dial error
			}
			r := testutil.Within(t, 20*time.Second, "Pin", func() pinned {
				p, err := Pin(tt.path)
				r := pinned{p: p, err: err}
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
