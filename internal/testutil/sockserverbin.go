package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// SockServerPackage is the import path of the hostile socket server.
const SockServerPackage = "github.com/kc-watchman/kc-watchman/internal/testutil/sockserver"

// SockServer says what StartSockServer's sockets do (see ./sockserver).
type SockServer struct {
	N        int  // socket names
	First    int  // the number in the first name, kc-<First>.sock
	Links    bool // one socket, hard-linked under every name
	Size     int  // answer with bodies of Size bytes (0: never answer)
	Announce bool // send Content-Length
	// UID, when not 0, runs the server as that user (and group): dir
	// must then let it create entries.
	UID int
}

// StartSockServer starts the server on dir, waits until every socket is
// in place and returns its process; cleanup kills it. Its sockets stay
// behind for the test's own directory cleanup.
func StartSockServer(t testing.TB, dir string, s SockServer) *exec.Cmd {
	t.Helper()
	bin := Build(t, SockServerPackage, "sockserver")
	// Another user cannot reach the build directory (0700); a copy next
	// to the test's files can be run by anyone.
	pub, err := os.MkdirTemp("", "kc-sockserver-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	if err := os.Chmod(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(pub, "sockserver")
	if err := CopyFile(bin, run, 0o755); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(pub, "ready")
	args := []string{"-dir", dir, "-n", strconv.Itoa(s.N), "-first", strconv.Itoa(s.First), "-ready", ready}
	if s.Links {
		args = append(args, "-links")
	}
	if s.Size > 0 {
		args = append(args, "-size", strconv.Itoa(s.Size))
	}
	if s.Announce {
		args = append(args, "-announce")
	}
	cmd := exec.Command(run, args...)
	if s.UID != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.UID)}}
	}
	out := &lockedBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sockserver: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return cmd
		}
		select {
		case <-exited:
			t.Fatalf("sockserver exited before it was ready: %s", out.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sockserver not ready after 30s: %s", out.String())
		}
	}
}
