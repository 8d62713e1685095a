package pgkill

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// TestScanGroupRefusesTheCaller: the search for late joiners hands what it
// finds to SIGTERM and SIGKILL, so a group that holds the calling process
// must come back as an error, never as a list with the caller in it. The
// test looks in its own group, which holds itself and, to show the search
// still works there, a child.
func TestScanGroupRefusesTheCaller(t *testing.T) {
	child := exec.Command("sleep", "1000") // stays in the test's group
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	own := syscall.Getpgrp()

	found, err := scanGroup(fingerprint.DefaultRoot, own)
	if err == nil || !strings.Contains(err.Error(), "is in the group itself") {
		t.Fatalf("scanGroup(own group %d) = %d processes, err %v; want the refusal", own, len(found), err)
	}
	if found != nil {
		t.Errorf("scanGroup returned processes along with its refusal: %v", found)
	}

	// The same search in a group without the caller finds its members.
	other := exec.Command("sleep", "1000")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	found, err = scanGroup(fingerprint.DefaultRoot, other.Process.Pid)
	if err != nil || len(found) != 1 || found[0].PID != other.Process.Pid {
		t.Fatalf("scanGroup(group %d) = %v, %v; want its one member", other.Process.Pid, found, err)
	}
}
