package supervise

import (
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// TestMembersBelow: the walk below the wrapper (here the test process)
// finds the live members of the groups named, a grandchild included, and
// leaves out a descendant in another group and the groups' processes
// that are not below it.
func TestMembersBelow(t *testing.T) {
	start := func(pgid int, script string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		buf := make([]byte, 64)
		n, _ := out.Read(buf) // the script prints once its children run
		if !strings.Contains(string(buf[:n]), "up") {
			t.Fatalf("%q did not start", script)
		}
		return cmd
	}
	// A group led by a shell with a grandchild (its sleep's sleep) and a
	// sibling in a group of its own.
	mine := start(0, `sh -c 'sleep 1000 & wait' & sleep 1000 & echo up; wait`)
	other := start(0, `sleep 1000 & echo up; wait`)
	r := &runner{o: Options{Root: fingerprint.DefaultRoot}}
	var got []fingerprint.Stat
	deadline := time.Now().Add(5 * time.Second)
	for got = r.membersBelow([]int{mine.Process.Pid}); len(got) < 4 && time.Now().Before(deadline); got = r.membersBelow([]int{mine.Process.Pid}) {
		time.Sleep(10 * time.Millisecond)
	}
	pids := make([]int, len(got))
	for i, m := range got {
		pids[i] = m.PID
		if m.PGID != mine.Process.Pid {
			t.Errorf("member %+v is not in the group", m)
		}
	}
	// The leader, its inner sh and that sh's sleep, and its own sleep.
	if len(got) != 4 || !slices.Contains(pids, mine.Process.Pid) || !slices.IsSorted(pids) {
		t.Errorf("members %v, want the 4 processes of group %d, sorted", pids, mine.Process.Pid)
	}
	if slices.Contains(pids, other.Process.Pid) {
		t.Errorf("a descendant in another group (%d) was listed", other.Process.Pid)
	}
	// The test's own group: the walk never lists its start, and none of
	// the test's descendants is in it.
	if got := r.membersBelow([]int{syscall.Getpgrp()}); len(got) != 0 {
		t.Errorf("members of the test's own group: %+v", got)
	}
}
