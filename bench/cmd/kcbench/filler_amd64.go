package main

import (
	"os"
	"syscall"
)

// clonePauser is implemented in filler_amd64.s.
func clonePauser(all, old *uint64, parent int) (pid int, errno int)

var allSignals = ^uint64(0)

// cloneFiller starts one filler process that shares the harness's memory
// (clone(CLONE_VM)) and pauses until it is killed. It must be called on
// the spawner's locked OS thread: PR_SET_PDEATHSIG fires when the thread
// that created the child exits.
func cloneFiller() (int, error) {
	var old uint64
	pid, errno := clonePauser(&allSignals, &old, os.Getpid())
	if errno != 0 {
		return 0, syscall.Errno(errno)
	}
	return pid, nil
}

const haveCloneFiller = true
