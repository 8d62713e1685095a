package sweep

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
)

var (
	// errOnFUSE marks a directory or entry on a user's FUSE mount.
	errOnFUSE = errors.New("on a user's FUSE mount")
	// errNewMount marks a directory on a mount the guard's table does
	// not hold: mounted after it was read, or past the 16 MiB read.
	errNewMount = errors.New("on a mount the mount table did not show")
	// errMountPoint marks an entry with something mounted over it.
	errMountPoint = errors.New("a mount point")
	// errReplaced marks a name that no longer holds the socket it was
	// found with when it is about to be dialled.
	errReplaced = errors.New("replaced since it was listed")
)

// fuseGuard holds the FUSE mounts of users other than root in the swept
// mount namespace. Root may enter one only where its user allowed others
// (allow_other), and then every lookup, open and listing in it waits on
// that user's server, for ever if it never answers: no deadline ends a
// system call. So the sweep enters none of them: no directory at or under
// one, no entry that is one.
//
// Paths are checked before they are opened; what was opened is checked
// again by its mount ID (nosync), which a mount put on the path after the
// table was read cannot pass: the table does not hold it.
type fuseGuard struct {
	points map[string]int // mount point: its user_id
	ids    map[uint64]int // every mount's ID: its FUSE user_id, or 0
	// err says the mount table could not be read whole; the guard holds
	// the mounts read before it.
	err error
	// whole is the table read again up to mountinfo.MaxWhole, once, for
	// a mount past the first read; shared by the guard's copies.
	whole *wholeRead
}

type wholeRead struct {
	path string
	done bool
	err  error
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
	g := fuseGuard{points: map[string]int{}, ids: map[uint64]int{}, err: err, whole: &wholeRead{path: path}}
	g.add(ms)
	return g
}

func (g fuseGuard) add(ms []mountinfo.Mount) {
	for _, m := range ms {
		uid, ok := m.FUSEUser()
		if ok && uid != 0 {
			g.points[filepath.Clean(m.Point)] = uid
		} else {
			uid = 0
		}
		g.ids[m.ID] = uid
	}
}

// mount says why the sweep must not use a directory opened (O_PATH, not
// yet entered) at p on the mount numbered id: a user's FUSE mount, or one
// the table does not hold. nil when it may, and where mount IDs are
// unknown: no table read, or a kernel before 5.8.
//
// A mount the table does not show has the table read again, once, whole
// up to 16 MiB, and is judged by that: a user's runtime directory
// mounted at his login mid-sweep, or a Kubernetes node's late mounts past
// a table cut at its first 1 MiB, are entered; a user's FUSE mount made
// since is his, and a user who made mounts to push his own past the
// table, or makes them faster than the sweep reads it, is refused.
func (g fuseGuard) mount(p string, id uint64) error {
	if id == 0 || len(g.ids) == 0 {
		return nil
	}
	uid, ok := g.ids[id]
	if !ok && g.whole != nil && !g.whole.done {
		g.whole.done = true
		var ms []mountinfo.Mount
		ms, g.whole.err = mountinfo.ReadWhole(g.whole.path)
		g.add(ms)
		uid, ok = g.ids[id]
	}
	switch {
	case !ok && g.whole != nil && g.whole.err != nil:
		return fmt.Errorf("%s: %w (mount %d; %v), not entered", p, errNewMount, id, g.whole.err)
	case !ok:
		return fmt.Errorf("%s: %w (mount %d, mounted since the table was read), not entered", p, errNewMount, id)
	case uid != 0:
		return fmt.Errorf("%s: %w of uid %d (mount %d), not entered: its server could hold the sweep for ever", p, errOnFUSE, uid, id)
	}
	return nil
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
