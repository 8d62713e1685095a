package testutil

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// HoldFlock starts `flock -x target sleep 600` as uid, in its own process
// group (killed as a group when t ends: flock's sleep holds the lock too),
// and returns once target is locked: another user holding a lock the code
// under test must not wait on.
func HoldFlock(t testing.TB, target string, uid int) {
	t.Helper()
	flockBin, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) not installed")
	}
	cmd := exec.Command(flockBin, "-x", target, "sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if uid != os.Geteuid() {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	f, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return
		}
		if err == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		}
		select {
		case <-exited:
			t.Fatalf("flock as uid %d exited before it took %s", uid, target)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("flock as uid %d never took %s", uid, target)
		}
	}
}
