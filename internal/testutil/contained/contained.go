// Package contained starts test processes in kc-watchman's cgroup of a
// container, as a supervisor wrapper would have. A package of its own:
// testutil is imported by internal/contain's tests.
package contained

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// Sleep starts a sleep in kc-watchman's cgroup of container id on h
// (the cgroup removed at cleanup, the sleep killed and reaped).
func Sleep(t *testing.T, h contain.Host, id string) *exec.Cmd {
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
