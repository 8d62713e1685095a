package testutil

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// OrphanSocket leaves a socket file at dir/name with nothing listening on
// it: what a SIGKILLed supervisor leaves behind.
func OrphanSocket(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	return p
}

// Serve accepts and closes connections on l until l is closed when the
// test ends: a live listener that answers connect(2).
func Serve(t testing.TB, l net.Listener) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// BoundSocket binds a socket of type typ to p and leaves it open, neither
// listening nor connected: a server between bind(2) and listen(2), or one
// that never gets to listen. The returned release closes it (once); the
// test's end closes it otherwise.
func BoundSocket(t testing.TB, p string, typ int) (fd int, release func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := unix.Close(fd); err != nil {
				t.Errorf("close %s: %v", p, err)
			}
		})
	}
	t.Cleanup(release)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		t.Fatalf("bind %s: %v", p, err)
	}
	return fd, release
}

// ForgeNetUnixLine binds, under dir, a listening socket whose name
// carries a newline and then a made-up /proc/net/unix line for victim, a
// short path: the kernel prints names raw, so net/unix then shows victim
// as a listening socket's path. It reports false where the name does not
// fit in sun_path. The socket goes with the test.
func ForgeNetUnixLine(t testing.TB, dir, victim string) bool {
	t.Helper()
	// Num RefCount Protocol Flags (__SO_ACCEPTCON) Type St Inode Path.
	name := filepath.Join(dir, "x\n0: 0 0 10000 1 1 1 "+filepath.Dir(victim), filepath.Base(victim))
	if len(name) >= 108 {
		return false
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return true
}
