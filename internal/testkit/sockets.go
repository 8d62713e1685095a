package testkit

import (
	"net"
	"path/filepath"
	"testing"
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
