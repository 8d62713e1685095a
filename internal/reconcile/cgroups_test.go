package reconcile

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestSweepsCgroupsOfGoneContainers: a kc-watchman/<id> cgroup whose
// container is gone and which no ledger record names (a wrapper killed
// before its teardown) is reported by a dry run and swept by an apply
// run: what is in it killed, the cgroup removed. A live container's, one
// outside --container and a young one are left, with their processes.
func TestSweepsCgroupsOfGoneContainers(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	gone, empty, liveID, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	inGone := contained(t, h, gone)
	contained(t, h, empty).Process.Kill() //nolint:errcheck // an emptied cgroup
	inLive := contained(t, h, liveID)
	inOther := contained(t, h, other)
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
	scope := map[string]bool{gone: true, empty: true, liveID: true}
	ctx := context.Background()
	dir := func(id string) string { return filepath.Join(h.Mount, contain.Dir, id) }
	outcomes := func(rep Report) map[string]action.Action {
		m := map[string]action.Action{}
		for _, c := range rep.Cgroups {
			m[c.ContainerID] = c.Outcome
		}
		return m
	}

	t.Run("young cgroups are left alone", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: scope, MinAge: time.Hour, Apply: true}, live)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Cgroups) != 0 {
			t.Errorf("swept %+v, want nothing within MinAge", rep.Cgroups)
		}
	})
	t.Run("an engine that vouches for another UID only", func(t *testing.T) {
		rootless := live
		rootless.UID = 4321
		rep, err := Run(ctx, Options{Containers: scope, Apply: true}, rootless)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Cgroups) != 0 || !running(inGone.Process.Pid) || !isDir(dir(empty)) {
			t.Errorf("swept %+v with an answer that vouches for uid 4321 only", rep.Cgroups)
		}
	})
	t.Run("dry run", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: scope}, live)
		if err != nil {
			t.Fatal(err)
		}
		got := outcomes(rep)
		if got[gone] != action.WouldReap || got[empty] != action.WouldReap || len(got) != 2 {
			t.Errorf("outcomes %v, want would-reap for %s and %s only", got, gone[:12], empty[:12])
		}
		if !running(inGone.Process.Pid) || !isDir(dir(empty)) {
			t.Error("a dry run touched a cgroup")
		}
	})
	t.Run("apply", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: scope, Apply: true}, live)
		if err != nil {
			t.Fatal(err)
		}
		got := outcomes(rep)
		if got[gone] != action.Reaped || got[empty] != action.Gone || len(got) != 2 {
			t.Errorf("outcomes %v, want reaped for %s, gone for %s", got, gone[:12], empty[:12])
		}
		if isDir(dir(gone)) || isDir(dir(empty)) {
			t.Error("a swept cgroup is still there")
		}
		if running(inGone.Process.Pid) {
			t.Errorf("process %d in the gone container's cgroup lives on", inGone.Process.Pid)
		}
		for _, c := range []*exec.Cmd{inLive, inOther} {
			if !running(c.Process.Pid) {
				t.Errorf("process %d of a live or unscoped container's cgroup was killed", c.Process.Pid)
			}
		}
		if !isDir(dir(liveID)) || !isDir(dir(other)) {
			t.Error("a live or unscoped container's cgroup was removed")
		}
	})
}

// contained starts a sleep in a session of its own inside
// kc-watchman/<id> on h, as a supervisor's escaped child would sit there.
func contained(t *testing.T, h contain.Host, id string) *exec.Cmd {
	t.Helper()
	cg, err := contain.Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	fd, _ := cg.CloneFD()
	t.Cleanup(func() { testutil.RemoveContainCgroups(t, id) })
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: fd}
	err = cmd.Start()
	cg.Close()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()          //nolint:errcheck // reaped, so a killed one leaves /proc
	t.Cleanup(func() { cmd.Process.Kill(); <-done }) //nolint:errcheck // it may be gone
	return cmd
}

func isDir(p string) bool {
	st, err := os.Lstat(p)
	return err == nil && st.IsDir()
}
