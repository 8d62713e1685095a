package sweep

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
)

// errOnFUSE marks a directory or entry on a user's FUSE mount.
var errOnFUSE = errors.New("on a user's FUSE mount")

// fuseGuard holds the FUSE mounts of users other than root in the swept
// mount namespace. Root may enter one only where its user allowed others
// (allow_other), and then every lookup, open and listing in it waits on
// that user's server, for ever if it never answers: no deadline ends a
// system call. So the sweep enters none of them: no directory at or under
// one, no entry that is one.
type fuseGuard struct {
	points map[string]int // mount point: its user_id
	// err says the mount table could not be read whole; the guard holds
	// the mounts read before it.
	err error
}

// readFUSEGuard reads the mount table of the namespace t's directories
// are opened in: the janitor's own, or the target container's, whose
// mount points are relative to its root as the directories' inner paths
// are.
func readFUSEGuard(procRoot string, t Target) fuseGuard {
	path := filepath.Join(procRoot, "self", "mountinfo")
	if t.Container() {
		path = filepath.Join(procRoot, strconv.Itoa(t.InitPID), "mountinfo")
	}
	ms, err := mountinfo.Read(path)
	g := fuseGuard{points: map[string]int{}, err: err}
	for _, m := range ms {
		if uid, ok := m.FUSEUser(); ok && uid != 0 {
			g.points[filepath.Clean(m.Point)] = uid
		}
	}
	return g
}

// refuse says why the sweep must not enter p: it is at or under a user's
// FUSE mount. nil when it may.
func (g fuseGuard) refuse(p string) error {
	for q := filepath.Clean(p); ; q = filepath.Dir(q) {
		if uid, ok := g.points[q]; ok {
			if q == filepath.Clean(p) {
				return fmt.Errorf("%s: %w of uid %d, not entered: its server could hold the sweep for ever", p, errOnFUSE, uid)
			}
			return fmt.Errorf("%s: %w of uid %d at %s, not entered: its server could hold the sweep for ever", p, errOnFUSE, uid, q)
		}
		if q == "/" || q == "." {
			return nil
		}
	}
}

// mountPoint says whether p is itself a user's FUSE mount point, for an
// entry of a directory that is not on one.
func (g fuseGuard) mountPoint(p string) error {
	if uid, ok := g.points[filepath.Clean(p)]; ok {
		return fmt.Errorf("%w of uid %d, not entered", errOnFUSE, uid)
	}
	return nil
}
