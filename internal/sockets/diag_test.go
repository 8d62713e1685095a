package sockets

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
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
		{"no path", append([]byte{unix.AF_UNIX, 1, 1, 0}, make([]byte, 12)...)},
		{"abstract name", append(append([]byte{unix.AF_UNIX, 1, tcpListen, 0}, make([]byte, 12)...), 8, 0, attrName, 0, 0, 'x', 'y', 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, ok := parseDiag(tc.data); ok {
				t.Fatalf("parse accepted %+v", s)
			}
		})
	}
}

// TestDiagNetUnix: sock_diag's table says what net/unix says of a
// listener and of a socket bound and not listening, and cannot be made to
// list a path nobody bound: a name holding a newline forges a line in
// net/unix, not in sock_diag.
func TestDiagNetUnix(t *testing.T) {
	dir, err := os.MkdirTemp("", "kcn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	listener := filepath.Join(dir, "kc-1.sock")
	l, err := net.Listen("unix", listener)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	bound := filepath.Join(dir, "kc-2.sock")
	_, release := testutil.BoundSocket(t, bound, unix.SOCK_STREAM)
	t.Cleanup(release)
	victim := testutil.OrphanSocket(t, dir, "kc-3.sock")
	if !testutil.ForgeNetUnixLine(t, dir, victim) {
		t.Fatalf("the forged name does not fit under %s", dir)
	}

	diag, err := DiagNetUnix()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := ReadNetUnix("/proc", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path          string
		procSays, diagSays  int // sockets listed at path
		listening, checkNet bool
	}{
		{"a listener", listener, 1, 1, true, true},
		{"bound, not listening", bound, 1, 1, false, true},
		{"nobody's, with a line forged in net/unix", victim, 1, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(proc[tc.path]); got != tc.procSays {
				t.Fatalf("net/unix lists %d sockets at %s, want %d (the test's premise)", got, tc.path, tc.procSays)
			}
			if got := len(diag[tc.path]); got != tc.diagSays {
				t.Fatalf("sock_diag lists %d sockets at %s, want %d", got, tc.path, tc.diagSays)
			}
			if tc.checkNet && (Listening(diag[tc.path]) != tc.listening || diag[tc.path][0].Inode != proc[tc.path][0].Inode) {
				t.Errorf("sock_diag: %+v; net/unix: %+v", diag[tc.path], proc[tc.path])
			}
		})
	}
}

// TestDiagNetUnixIn: a supervisor listening in a network namespace of its
// own is not in our table; asked in its namespace, its socket is there,
// by its path and by the socket file.
func TestDiagNetUnixIn(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command(testutil.BuildKCServer(t), "--transport=socket", "--socket-dir="+dir)
	cmd.Env = []string{"KCFAKE_READY_FILE=" + ready}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Skipf("no network namespace here: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(15 * time.Second); !testutil.PathExists(ready); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fake is not listening")
		}
	}
	p := filepath.Join(dir, "kc-"+strconv.Itoa(cmd.Process.Pid)+".sock")
	f, err := Examine(p)
	if err != nil {
		t.Fatal(err)
	}

	ours, err := DiagNetUnix()
	if err != nil {
		t.Fatal(err)
	}
	if len(ours.Held(p, f)) > 0 {
		t.Fatalf("%s is in our namespace's table: the test needs it elsewhere", p)
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	theirs, err := DiagNetUnixIn(ns)
	if err != nil {
		t.Fatal(err)
	}
	if !Listening(theirs.Held(p, f)) || !Listening(theirs.Held("/elsewhere/"+filepath.Base(p), f)) {
		t.Errorf("%s not listening in its namespace's table (by path %v, by file %v)", p, Listening(theirs[p]), Listening(theirs.Held("", f)))
	}
	// Asking there left this thread, and every other, in our namespace.
	if again, err := DiagNetUnix(); err != nil || len(again.Held(p, f)) > 0 {
		t.Errorf("after asking in another namespace, ours shows %s: %v", p, err)
	}
}
