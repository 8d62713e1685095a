package supervise

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
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

// TestMembersInCgroup: the confirmation of a look that found no member
// reads the command's cgroup: it lists the cgroup's members of the groups
// named, not a process of the cgroup in another group nor one of the
// groups outside the cgroup.
func TestMembersInCgroup(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	id := testutil.RandomHex(t, 64)
	cg, err := contain.Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close(); testutil.RemoveContainCgroups(t, id) })
	fd, _ := cg.CloneFD()
	start := func(pgid int, inside bool) *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid, UseCgroupFD: inside, CgroupFD: fd}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Killed before the cgroup's removal above (cleanups run last first).
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	leader := start(0, true)
	member := start(leader.Process.Pid, true)
	outside := start(leader.Process.Pid, false)
	otherGroup := start(0, true)
	r := &runner{o: Options{Root: fingerprint.DefaultRoot}, cg: cg}
	var pids []int
	for _, m := range r.membersInCgroup([]int{leader.Process.Pid}) {
		pids = append(pids, m.PID)
	}
	if !slices.Equal(pids, []int{leader.Process.Pid, member.Process.Pid}) {
		t.Errorf("members %v, want %d and %d (not %d outside the cgroup, not %d of another group)",
			pids, leader.Process.Pid, member.Process.Pid, outside.Process.Pid, otherGroup.Process.Pid)
	}
}
