package trees

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// A tree's process group is not the whole tree: a kernel's child that
// starts a session of its own (setsid, start_new_session=True, a daemon)
// leaves the group and a killpg no longer reaches it (DESIGN "Descendants that leave the group"). Its
// parent link still ties it to the tree until its parent dies, so the
// scan follows the links down from every member and adds what it finds.

// monitorComm reports whether comm is a container monitor: a kernel that
// runs `podman run` has its conmon (and so another container) adopted by
// the tree, and the walk must not take that container down with it.
// containerd-shim-runc-v2's comm is cut to 15 bytes: "containerd-shim".
func monitorComm(comm string) bool {
	return comm == "conmon" || strings.HasPrefix(comm, "containerd-shim")
}

// maxDescendants bounds the walk: a fork bomb under a tree must not turn
// one scan into an unbounded read of the host.
const maxDescendants = 4096

// addDescendants fills t.Escaped and t.Withheld from the parent links of
// the listing (kids, indexed once per scan), or, where the listing has
// none (the /proc fallback, the full scan), from the children files of
// the tree's own processes only (DESIGN "One view of the host").
func addDescendants(root string, t *Tree, kids childIndex) {
	addDescendantsUpTo(root, t, kids, maxDescendants)
}

func addDescendantsUpTo(root string, t *Tree, kids childIndex, limit int) {
	if len(t.Members) == 0 {
		return
	}
	var capped bool
	t.Escaped, t.Withheld, capped = descendants(root, kids.of(root), t.Members, Rules{
		InGroup:     func(pgid int) bool { return pgid == t.PGID },
		UID:         t.UID,
		ContainerID: t.ContainerID,
	}, limit)
	for _, w := range t.Withheld {
		t.callerBelow = t.callerBelow || w.PID == os.Getpid()
	}
	if (capped || len(t.Withheld) > 0) && !t.callerBelow {
		// The walk stopped short of the caller, maybe: at its bound, or
		// at a process it withholds (sudo or su between a kernel's
		// terminal and the janitor run from it), below which nothing is
		// walked. The shells between a member and the caller may be
		// among the escaped: look up from the caller instead.
		t.callerBelow = callerUnder(root, t)
	}
}

// callerUnder says whether a member or an escaped process of t is an
// ancestor of the caller, or the caller's ancestry cannot be read to the
// end (then it may be: the doubt spares the tree). The ancestry is short;
// it is read only when the walk down was cut or withheld something.
func callerUnder(root string, t *Tree) bool {
	ours := map[int]uint64{}
	for _, m := range t.Members {
		ours[m.PID] = m.StartTicks
	}
	for _, e := range t.Escaped {
		ours[e.PID] = e.StartTicks
	}
	pid := os.Getppid()
	for range 1024 {
		if pid <= 1 {
			return false
		}
		st, err := fingerprint.ReadStat(root, pid)
		if err != nil {
			return true
		}
		if ticks, ok := ours[pid]; ok && ticks == st.StartTicks {
			return true
		}
		pid = st.PPID
	}
	return true
}

// childIndex is a listing's processes by parent; nil where the listing
// has no parent links.
type childIndex map[int][]int

// indexChildren indexes l's processes by parent, once for all of a
// scan's trees: per tree, it cost a pass over the whole host.
func indexChildren(l *proctable.Listing) childIndex {
	if l == nil || l.PPIDs == nil || l.PPIDsPartial {
		return nil
	}
	byParent := make(childIndex, len(l.PIDs)/4)
	for i, pp := range l.PPIDs {
		if pp > 0 && l.PGIDs[i] > 0 {
			byParent[int(pp)] = append(byParent[int(pp)], l.PIDs[i])
		}
	}
	return byParent
}

// of returns the children lookup: the index, or the children files.
func (k childIndex) of(root string) func(pid int) []int {
	if k == nil {
		return func(pid int) []int { return Children(root, pid) }
	}
	return func(pid int) []int { return k[pid] }
}

// Rules say which descendants of a tree's processes are its members.
type Rules struct {
	// InGroup: processes of these groups are members already (killpg or
	// the wrapper's member-by-member kill reaches them); the walk goes
	// through them without reporting them.
	InGroup func(pgid int) bool
	// UID is the tree's UID; a descendant that does not run wholly as it
	// (real, effective and saved: a setuid program keeps only the real
	// one), or any when negative, is withheld.
	UID int
	// AlsoUIDs are more UIDs the tree runs as wholly: a kc-hook wrapper's
	// command that an allowlist entry starts through setpriv.
	AlsoUIDs []int
	// ContainerID is the tree's container; a descendant carrying any
	// other container's ID is withheld.
	ContainerID string
}

// Descendants walks down from the given processes and returns the live
// descendants outside their groups that may be signalled with them
// (escaped) and those reported only (withheld: another UID, another
// container's ID, an argv that could not be read). The walk does not go
// below a withheld process, nor into a container monitor, nor to the
// caller. l's parent links are used when it has them (nil: read the
// children files of the walked processes only).
func Descendants(root string, l *proctable.Listing, from []fingerprint.Identity, r Rules) (escaped, withheld []fingerprint.Identity) {
	escaped, withheld, _ = descendants(root, indexChildren(l).of(root), from, r, maxDescendants)
	return escaped, withheld
}

// descendants walks down from from, reading at most limit processes;
// capped says it stopped there.
func descendants(root string, children func(pid int) []int, from []fingerprint.Identity, r Rules, limit int) (escaped, withheld []fingerprint.Identity, capped bool) {
	visited := make(map[int]bool, len(from))
	queue := make([]fingerprint.Identity, 0, len(from))
	for _, m := range from {
		visited[m.PID] = true
		queue = append(queue, m)
	}
	seen := 0
	for len(queue) > 0 {
		parent := queue[0]
		queue = queue[1:]
		for _, pid := range children(parent.PID) {
			if visited[pid] {
				continue
			}
			if seen >= limit {
				return escaped, withheld, true
			}
			visited[pid] = true
			seen++
			id, err := fingerprint.Read(root, pid)
			gone := errors.Is(err, fingerprint.ErrNotFound) || errors.Is(err, fingerprint.ErrRecycled) || errors.Is(err, fingerprint.ErrNotProcess)
			if err != nil && !gone {
				// Its argv, which may name another container, cannot
				// be read (its memory held, over the cap, malformed):
				// reported, not signalled, and not walked below.
				if st, err := fingerprint.ReadStat(root, pid); err == nil && !st.Zombie() && st.PPID == parent.PID {
					withheld = append(withheld, fingerprint.Identity{Stat: st, TGID: pid, UID: -1, EUID: -1, SUID: -1})
				}
				continue
			}
			if err != nil || id.Zombie() {
				continue // gone since the listing: nothing to kill
			}
			// The child must still be the parent's: a PID listed under a
			// parent that exited and was reused by an unrelated process
			// is not the tree's. A child reparented since (its parent
			// died) has lost the link the walk trusts, and is left.
			if id.PPID != parent.PID || id.StartTicks < parent.StartTicks {
				continue
			}
			// And the parent must still be the one walked from, read after
			// the child: had its PID been handed to another process, the
			// child would be that process's. A PID is never held by two
			// processes at once, so a parent alive with the same start
			// time after the child's read was its parent at that read.
			if !fingerprint.Alive(root, parent.Stat) {
				continue
			}
			if pid == os.Getpid() {
				// A janitor run from a terminal the tree's kernel
				// opened: it and the shells above it are not to be
				// killed by its own run.
				withheld = append(withheld, id)
				continue
			}
			if monitorComm(id.Comm) {
				continue // another container's monitor: not this tree
			}
			if r.InGroup(id.PGID) {
				// The group's rules cover it; what it started may
				// have left the group.
				queue = append(queue, id)
				continue
			}
			if !r.allows(id) {
				withheld = append(withheld, id)
				continue // what runs under it is not ours to judge
			}
			escaped = append(escaped, id)
			queue = append(queue, id)
		}
	}
	return escaped, withheld, false
}

// Member says whether a process found in a tree's cgroup may be
// signalled with the tree: not a container monitor, of the tree's UID and
// carrying no other container's ID (DESIGN "Descendants that leave the
// group").
func (r Rules) Member(id fingerprint.Identity) bool {
	return !monitorComm(id.Comm) && r.allows(id)
}

// allows says whether a descendant may be signalled with the tree: only
// one of the tree's UID that carries no other container's ID (the identity rules'
// anchors and ownership rules). A setuid program the tree's user ran
// keeps the user's real UID but runs as another: it is not the tree's
// to signal (DESIGN "Killing safely").
func (r Rules) allows(id fingerprint.Identity) bool {
	if r.UID < 0 || !id.RunsAs(r.UID) && !slices.ContainsFunc(r.AlsoUIDs, id.RunsAs) {
		return false
	}
	for _, cid := range containerid.FromArgv(id.Argv) {
		if cid != r.ContainerID {
			return false
		}
	}
	return true
}

// Children reads the children of every thread of pid, in PID order; a
// process that is gone has none.
func Children(root string, pid int) []int {
	dir := root + "/" + strconv.Itoa(pid) + "/task"
	tids, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, tid := range tids {
		data, err := os.ReadFile(dir + "/" + tid.Name() + "/children")
		if err != nil {
			continue // the thread exited: its children are another's now
		}
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	// A child is listed once, under the thread that forked it; sorted
	// rather than searched, so that a user's process with thousands of
	// children costs no quadratic time.
	slices.Sort(out)
	return slices.Compact(out)
}
