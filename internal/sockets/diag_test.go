package sockets

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListeningFindsOwnSocket binds a socket and expects sock_diag to name
// it with the inode of its file; a socket that stops listening must drop
// out.
func TestListeningFindsOwnSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kc-1.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	find := func() (DiagSocket, bool) {
		t.Helper()
		socks, err := DiagListening()
		if err != nil {
			t.Fatalf("Listening: %v", err)
		}
		for _, s := range socks {
			if s.Path == path {
				return s, true
			}
		}
		return DiagSocket{}, false
	}
	s, ok := find()
	if !ok {
		t.Fatalf("%s not listed", path)
	}
	if !s.HasVFS || s.Ino != st.Ino || s.Dev != st.Dev {
		t.Fatalf("listed with file dev %d ino %d (vfs %v), stat says dev %d ino %d", s.Dev, s.Ino, s.HasVFS, st.Dev, st.Ino)
	}
	if s.Inode == 0 || s.Inode == s.Ino {
		t.Fatalf("socket inode %d: want the socket's own, not its file's", s.Inode)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, ok := find(); ok {
		t.Fatalf("%s still listed after close", path)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the file should stay: %v", err)
	}
}

func TestParseRejectsShortAndAbstract(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"short", []byte{unix.AF_UNIX, 1, tcpListen}},
		{"not listening", append([]byte{unix.AF_UNIX, 1, 1, 0}, make([]byte, 12)...)},
		{"abstract name", append(append([]byte{unix.AF_UNIX, 1, tcpListen, 0}, make([]byte, 12)...), 8, 0, attrName, 0, 0, 'x', 'y', 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, ok := parseDiag(tc.data); ok {
				t.Fatalf("parse accepted %+v", s)
			}
		})
	}
}
