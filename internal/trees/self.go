package trees

import (
	"os"

	"golang.org/x/sys/unix"
)

// HoldsCaller reports whether the calling process is in the tree's group.
// kc-hook runs in whatever group its runtime gave it — at poststop that can
// be conmon's, whose leader has exited and whose members (podman's cleanup
// process) carry the container ID — so a scan can find the caller's own
// group looking like a supervisor tree. Signalling it would stop the hook
// itself; callers never do. Nor do they signal a tree the caller descends
// from: killing the shells between a member and the caller would end the
// run, or the session, that asked.
func (t Tree) HoldsCaller() bool {
	if t.callerBelow || t.PGID == os.Getpid() || t.PGID == unix.Getpgrp() {
		return true
	}
	for _, m := range t.Members {
		if m.PID == os.Getpid() {
			return true
		}
	}
	return false
}
