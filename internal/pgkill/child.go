package pgkill

import (
	"os/exec"
	"syscall"
)

// OwnGroupKilledOnCancel puts the child cmd will start in a process group
// of its own, and makes the end of cmd's context kill that whole group, so
// that neither the child nor what it started (a wrapper script's children)
// outlives the caller's deadline. The group is killed only while the
// child is unreaped: until then its PID, which is the group's ID, is
// still the child's (os.Process signals through a pidfd, and reports
// ErrProcessDone once Wait has reaped it).
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
