package pgkill

import (
	"context"
	"errors"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// OwnGroupKilledOnCancel puts the child cmd will start in a process group
// of its own, and makes the end of cmd's context kill that whole group, so
// that neither a hanging child nor what it started (a wrapper script's
// children) outlives the caller's deadline. What the child leaves in its
// group after exiting by itself stays (podman's rootless pause process
// must); RunOwnGroup is for a child that may leave nothing. The group is
// killed only if the child was unreaped a moment before (os.Process
// signals through a pidfd, and reports ErrProcessDone once Wait has
// reaped it). Wait may reap it in between: the group's ID still cannot
// name another group while any member lives, so only an emptied group
// whose number a new group took within that moment could be hit.
// RunOwnGroup, which holds off the reap (WNOWAIT), has no such window.
func OwnGroupKilledOnCancel(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error {
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			return err
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// RunOwnGroup runs cmd (made with exec.Command, not CommandContext) in a
// process group of its own and SIGKILLs that whole group when the child
// exits or ctx ends, whichever comes first: nothing the child started in
// its group outlives the call, even when the child exits at once and
// leaves a process holding its stdout. The kill comes before the child is
// reaped (waitid with WNOWAIT), while its PID, the group's ID, cannot be
// another process's; the child itself is killed too, in whatever group it
// moved to. timedOut says ctx ended first.
func RunOwnGroup(ctx context.Context, cmd *exec.Cmd) (timedOut bool, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return false, err
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	select {
	case <-exited:
	case <-ctx.Done():
		timedOut = true
	}
	// Unreaped until cmd.Wait below, so the group is still the child's,
	// and the PID its own: a child that moved itself into another group
	// is not in the one killed, and is killed by PID.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
	<-exited
	return timedOut, cmd.Wait()
}
