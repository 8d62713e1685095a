package pathwalk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

var (
	// ErrOnFUSE marks a directory or entry on a user's FUSE mount.
	ErrOnFUSE = errors.New("on a user's FUSE mount")
	// ErrNewMount marks a directory on a mount the guard's table does
	// not hold: mounted after it was read, or past the 16 MiB read.
	ErrNewMount = errors.New("on a mount the mount table did not show")
	// ErrTableStale marks (with ErrNewMount) a refusal because the table
	// could not be kept current (it kept changing past the re-read
	// budget, or its change could not be told): nothing new is judged,
	// whoever mounted what, and a caller must not take it for one
	// user's mount.
	ErrTableStale = errors.New("the mount table could not be kept current")
)

// Guard holds the FUSE mounts of users other than root in one mount
// namespace. Root may enter one only where its user allowed others
// (allow_other), and then every lookup, open and listing in it waits on
// that user's server, for ever if it never answers: no deadline ends a
// system call. So kc-watchman enters none of them: no directory at or
// under one, no entry that is one.
//
// Paths are checked before they are opened; what was opened is checked
// again by its mount ID (Fstat). An ID is judged by a table read since
// the namespace's mounts last changed: the kernel hands a freed ID out
// again, and a user's FUSE mount could otherwise pass for the mount the
// ID was when the table was read.
//
// A Guard's copies share its table, which a judgment may read again in
// place: it is not safe for concurrent use. The zero Guard, and one
// closed, refuse every mount.
type Guard struct {
	points map[string]int // mount point: its user_id (-1: not a host UID)
	ids    map[uint64]int // every mount's ID: its FUSE user_id, or 0
	// err says the mount table could not be read whole; the guard holds
	// the mounts read before it.
	err error
	// table is the table held open, shared by the guard's copies; its f
	// is nil where none could be opened.
	table *heldTable
}

type heldTable struct {
	f *mountinfo.Table
	// userNS: the namespace is not the initial user namespace's, and a
	// FUSE mount's user_id (counted in its mounter's namespace) says
	// nothing of who it is on the host: every FUSE mount there is a
	// user's.
	userNS bool
	// container: the table is a container's, not the caller's own.
	container bool
	// whole: read again up to mountinfo.MaxWhole since the first read;
	// err is the last read's error.
	whole bool
	err   error
	// budget is what is left of the bytes the table may be read again.
	budget int64
	// rootDevs are the devices of the file systems our own table shows
	// as root's (no user's FUSE), for a container in a user namespace: a
	// mount made inside one never shows in ours, so a device seen here
	// is root's doing, whatever its user_id there says.
	rootDevs map[string]bool
	// idsOnly: the table is the caller's own namespace's, read for a
	// container chrooted in it; its mount points are not its paths.
	idsOnly bool
	// stale says why the table no longer tells what an ID is: the kernel
	// said it changed and it could not be read again. Poll says a change
	// once, so this sticks: every later judgment is a refusal.
	stale error
}

// rereadBudget bounds what one guard reads of its table again (the last
// read may go past it): a busy node's mounts come and go, and a run needs
// a few reads of its table; a user who makes and unmakes mounts without
// end gets the paths judged after it refused, not the run held reading.
const rereadBudget = 64 << 20

// ReadGuard reads the mount table of the namespace paths are walked in:
// the caller's own (initPID 0), or that of the container whose init is
// initPID, whose mount points are relative to its root as the paths
// walked inside it are. Close releases it.
func ReadGuard(procRoot string, initPID int) Guard {
	container := initPID > 0
	dir := filepath.Join(procRoot, "self")
	if container {
		dir = filepath.Join(procRoot, strconv.Itoa(initPID))
	}
	g := Guard{points: map[string]int{}, ids: map[uint64]int{}, table: &heldTable{budget: rereadBudget, container: container}}
	m, err := userns.ReadMap(filepath.Join(dir, "uid_map"))
	g.table.userNS = err != nil || !m.Initial()
	if g.table.userNS && container {
		g.table.rootDevs = rootDevs(procRoot)
	}
	table := filepath.Join(dir, "mountinfo")
	if container && SameMountNS(procRoot, initPID) {
		// A process chrooted in our own namespace sees only the mounts
		// under its root, not the one that holds it: its mounts are ours,
		// judged by our table's IDs. Their points are not its paths, and
		// are not used.
		table, g.table.idsOnly = filepath.Join(procRoot, "self", "mountinfo"), true
	}
	f, err := mountinfo.Open(table)
	if err != nil {
		// Without a table nothing can be judged: every mount is refused.
		g.err, g.table.stale = err, fmt.Errorf("cannot read the mount table: %w", err)
		return g
	}
	g.table.f = f
	var ms []mountinfo.Mount
	ms, g.err = f.Read(mountinfo.Max)
	if len(ms) == 0 {
		// Never so: the namespace has its root. Taken as no table, it
		// would let every mount pass.
		g.table.stale = fmt.Errorf("the mount table shows no mount (%v)", g.err)
	}
	g.add(ms)
	return g
}

// rootDevs reads our own table for the devices of root's file systems;
// none where we are in a user namespace ourselves, or cannot tell.
func rootDevs(procRoot string) map[string]bool {
	self := filepath.Join(procRoot, "self")
	if m, err := userns.ReadMap(filepath.Join(self, "uid_map")); err != nil || !m.Initial() {
		return nil
	}
	ms, _ := mountinfo.Read(filepath.Join(self, "mountinfo"))
	devs := map[string]bool{}
	for _, m := range ms {
		if uid, fuse := m.FUSEUser(); !fuse || uid == 0 {
			devs[m.Dev] = true
		}
	}
	return devs
}

// Err says why the mount table was not read whole; the guard judges by
// the mounts read before it.
func (g Guard) Err() error { return g.err }

// SameMountNS reports whether pid sees the caller's mount namespace: a
// path it names in a private one names another file here.
func SameMountNS(procRoot string, pid int) bool {
	theirs, err1 := os.Readlink(procRoot + "/" + strconv.Itoa(pid) + "/ns/mnt")
	ours, err2 := os.Readlink("/proc/self/ns/mnt")
	return err1 == nil && err2 == nil && theirs == ours
}

// Close releases the table held open; the guard then refuses every
// mount, as it can no longer tell whether the table changed.
func (g Guard) Close() {
	if g.table == nil {
		return
	}
	if g.table.f != nil {
		g.table.f.Close()
	}
	g.table.stale = errClosed
}

// errClosed is why a closed guard refuses.
var errClosed = errors.New("the mount table was closed")

// add puts ms in the guard, in place of what it held.
func (g Guard) add(ms []mountinfo.Mount) {
	clear(g.points)
	clear(g.ids)
	for _, m := range ms {
		uid, ok := m.FUSEUser()
		userNS := g.table != nil && g.table.userNS
		switch {
		case userNS && g.table.rootDevs[m.Dev]:
			// Root's own file system, seen in it too (a userns-remap
			// container's overlay root, lxcfs): as our table says.
			uid = 0
		case !ok && userNS && g.table.container && m.FSType == "overlay":
			// Its layers are whatever the namespace's root chose: his
			// own FUSE mounts, maybe, reached through it. In the
			// caller's own user namespace (a rootless podman's hook)
			// the caller is that user, or the overlay the host's (an
			// overlay root), and is not judged so.
			uid = overlayOfUserNS
		case !ok:
			uid = 0
		case userNS:
			uid = -1
		}
		if uid != 0 && (g.table == nil || !g.table.idsOnly) {
			g.points[filepath.Clean(m.Point)] = uid
		}
		g.ids[m.ID] = uid
	}
}

// reread reads the table again, whole up to mountinfo.MaxWhole, or marks
// it stale.
func (g Guard) reread() {
	t := g.table
	if t.budget <= 0 {
		t.stale = fmt.Errorf("the mount table kept changing: read again %d MiB during this run", rereadBudget>>20)
		return
	}
	ms, n, err := t.f.ReadN(mountinfo.MaxWhole)
	t.budget -= n
	if len(ms) == 0 {
		t.stale = fmt.Errorf("the mount table read again shows no mount (%v)", err)
		return
	}
	g.add(ms)
	t.whole, t.err = true, err
}

// Mount says why the caller must not use a directory opened (O_PATH, not
// yet entered) at p on the mount numbered id: a user's FUSE mount, or one
// the table does not hold. nil when it may, and where the kernel gives
// no mount IDs (before 5.8).
//
// The table is read again first if the namespace's mounts changed since
// it was read: while the caller holds the directory open, its mount's ID
// cannot be freed, so the table then tells what it is. A mount the table
// does not show has the table read again, whole up to 16 MiB: a
// Kubernetes node's late mounts past a table cut at its first 1 MiB are
// judged, and a user who made mounts to push his own past the table is
// refused.
func (g Guard) Mount(p string, id uint64) error {
	refused := func(why error) error {
		return fmt.Errorf("%s: %w (mount %d; %v), not entered", p, ErrNewMount, id, why)
	}
	// Only the sentinel is wrapped: a stale table's cause (a read's
	// error) must not pass for the directory's own.
	stale := func(why error) error {
		return fmt.Errorf("%s: %w, %w (mount %d; %v), not entered", p, ErrNewMount, ErrTableStale, id, why)
	}
	switch {
	case g.table == nil:
		return refused(errors.New("no mount table was read"))
	case id == 0:
		return nil // no mount IDs: Linux before 5.8
	}
	t := g.table
	if t.stale == nil {
		switch changed, err := t.f.Changed(); {
		case err != nil:
			t.stale = fmt.Errorf("cannot tell whether the mount table changed: %w", err)
		case changed:
			g.reread()
		}
	}
	if t.stale != nil {
		return stale(t.stale)
	}
	uid, ok := g.ids[id]
	if !ok && !t.whole {
		if g.reread(); t.stale != nil {
			return stale(t.stale)
		}
		uid, ok = g.ids[id]
	}
	switch {
	case !ok && t.err != nil:
		return refused(t.err)
	case !ok:
		return fmt.Errorf("%s: %w (mount %d, not in the table read again), not entered", p, ErrNewMount, id)
	case uid != 0:
		return fmt.Errorf("%s: %w %s (mount %d), not entered: its server could hold this run for ever", p, ErrOnFUSE, fuseOwner(uid), id)
	}
	return nil
}

// overlayOfUserNS marks an overlay a user namespace made, in the guard's
// maps of FUSE owners.
const overlayOfUserNS = -2

// fuseOwner names whose a user's FUSE mount is.
func fuseOwner(uid int) string {
	switch {
	case uid == overlayOfUserNS:
		return "(an overlay a user namespace made, on layers its user chose)"
	case uid < 0:
		return "of a user (its user_id is no host UID)"
	}
	return "of uid " + strconv.Itoa(uid)
}

// Refuse says why the caller must not enter p: it is at or under a user's
// FUSE mount. nil when it may.
func (g Guard) Refuse(p string) error {
	for q := filepath.Clean(p); ; q = filepath.Dir(q) {
		if uid, ok := g.points[q]; ok {
			if q == filepath.Clean(p) {
				return fmt.Errorf("%s: %w %s, not entered: its server could hold this run for ever", p, ErrOnFUSE, fuseOwner(uid))
			}
			return fmt.Errorf("%s: %w %s at %s, not entered: its server could hold this run for ever", p, ErrOnFUSE, fuseOwner(uid), q)
		}
		if q == "/" || q == "." {
			return nil
		}
	}
}

// MountPoint says whether p is itself a user's FUSE mount point, for an
// entry of a directory that is not on one.
func (g Guard) MountPoint(p string) error {
	if uid, ok := g.points[filepath.Clean(p)]; ok {
		return fmt.Errorf("%w %s, not entered", ErrOnFUSE, fuseOwner(uid))
	}
	return nil
}
