// Package corroborate looks for local evidence that a container still runs
// (DESIGN "Ground truth must be corroborated"). An engine's list is ground truth only if it is the right
// list: an engine asked about another store (a different --root, another
// user's service) answers with a list that is complete and wrong. Before a
// tree is called stray, evidence that its container still runs wins over
// the engine's silence: a monitor's live child in the container's own
// cgroup, or the init process the hook recorded. Evidence is of running,
// never of existing: a shim or conmon alone is none.
package corroborate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/mountinfo"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// Kinds of evidence.
const (
	// KindCgroup: a live child of a container monitor (conmon,
	// containerd-shim*) sits in the container's own cgroup. A monitor
	// alone is not evidence: a containerd task that exited and was not
	// deleted keeps its shim, and a pod's shim carries only the
	// sandbox's ID.
	KindCgroup = "cgroup"
	// KindLedgerInit: the ledger holds, from this boot, the container's
	// init process, still alive, and no poststop after it.
	KindLedgerInit = "ledger-init"
)

// Evidence is one sign that a container still runs here.
type Evidence struct {
	ContainerID string
	Kind        string
	PID         int
	StartTicks  uint64
	Comm        string
	// UID is the process's real UID; the ledger's init counts as root's
	// (root's hook recorded it in root's state dir).
	UID int
	// Cgroup is the cgroup path that matched (KindCgroup).
	Cgroup string
	// Monitor and MonitorPID are the parent monitor (KindCgroup).
	Monitor    string
	MonitorPID int
}

// Root reports whether the evidence is root's: only root's may say that
// a whole answer is of the wrong store (DESIGN "Ground truth must be corroborated").
func (e Evidence) Root() bool { return e.UID == 0 }

func (e Evidence) String() string {
	switch e.Kind {
	case KindCgroup:
		return fmt.Sprintf("its process %s (pid %d, uid %d, child of %s %d) is alive in its cgroup %s", e.Comm, e.PID, e.UID, e.Monitor, e.MonitorPID, e.Cgroup)
	case KindLedgerInit:
		return fmt.Sprintf("its init process (pid %d) recorded by kc-hook is alive with no poststop", e.PID)
	}
	return e.Kind
}

// Query is one stray candidate to look for evidence of.
type Query struct {
	ID string
	// UID is the tree's UID: evidence of another non-root UID does not
	// count (anyone can name a cgroup or a process after a container).
	UID int
	// Members are the tree's PIDs: neither they nor their descendants
	// are evidence (a supervisor wrapper orphaned into a monitor's care
	// is the tree, not the container).
	Members []int
	// Exited: an engine lists the container, not running. Only the
	// recorded init can contradict that.
	Exited bool
}

// Checker answers "does this container still run here?" from the run's
// snapshot of the host and the ledger. Monitors and their children are
// looked for once, on the first question, so a run with no stray
// candidates reads nothing more; and they are looked for in the snapshot,
// never by listing /proc again (DESIGN "One view of the host"): only the monitors' children
// have their cgroup read.
type Checker struct {
	root    string
	snap    *proctable.Listing
	records map[string]*ledger.Record
	boot    string

	scanned  bool
	children []child
	// parents are the parent links learnt beyond the snapshot's (the
	// /proc listing has none).
	parents map[int]int
	scanErr error
	own     map[string]bool
	// monitors are the snapshot's live monitors; monCgroups their cgroup
	// lines, by PID, as read.
	monitors   map[int]bool
	monCgroups map[int]map[string]bool
	// byName and byLine index children (ascending positions in it) by
	// the container IDs their cgroup lines are named after and by the
	// lines themselves: a run with many strays and many live containers
	// (a node drained) looks up each candidate's children instead of
	// matching all of them.
	byName, byLine map[string][]int
}

// child is a live child of a container monitor.
type child struct {
	fingerprint.Stat
	uid     int
	cgroups []string // "hierarchy:path" lines of /proc/<pid>/cgroup
	monitor proctable.Proc
}

// New returns a Checker over the procfs mount root (default /proc), the
// snapshot the run's decisions read (taken with Watch as its
// proctable.Options.Watch; nil: the first question lists the host
// itself, for a run whose scan kept no listing) and the ledger records of
// the boot bootID (records may be nil).
func New(root string, snap *proctable.Listing, records []*ledger.Record, bootID string) *Checker {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	c := &Checker{root: root, snap: snap, boot: bootID, records: map[string]*ledger.Record{}}
	for _, r := range records {
		if r != nil {
			c.records[r.ContainerID] = r
		}
	}
	return c
}

// Running is Check for a container no engine lists, with no tree.
func (c *Checker) Running(id string, uid int) (Evidence, bool, error) {
	return c.Check(Query{ID: id, UID: uid})
}

// Check returns the evidence that the container of q still runs here, if
// any. An error means the monitors' children could not be looked for.
func (c *Checker) Check(q Query) (Evidence, bool, error) {
	if q.ID == "" {
		return Evidence{}, false, nil
	}
	if e, ok := c.ledgerInit(q.ID); ok {
		return e, true, nil
	}
	if q.Exited {
		return Evidence{}, false, nil
	}
	if !c.scanned {
		c.scanErr = c.scan()
		c.scanned = true
	}
	var exact []string
	if r := c.records[q.ID]; r != nil && r.BootID == c.boot && c.boot != "" {
		exact = r.Cgroups
	}
	members := make(map[int]bool, len(q.Members))
	for _, m := range q.Members {
		members[m] = true
	}
	for _, i := range c.candidates(q.ID, exact) {
		ch := c.children[i]
		// Another user's process counts only as a child of root's
		// monitor (a rootful container run as a third UID): a user can
		// make no child of root's shim or conmon, but can run a monitor
		// of his own.
		if ch.uid != 0 && ch.uid != q.UID && ch.monitor.UID != 0 {
			continue
		}
		if _, ok := c.inContainer(ch.cgroups, q.ID, exact); !ok {
			continue
		}
		cg, ok := c.inContainer(c.notMonitors(ch), q.ID, exact)
		if !ok || c.descends(ch.PID, members) {
			continue
		}
		return Evidence{ContainerID: q.ID, Kind: KindCgroup, PID: ch.PID, StartTicks: ch.StartTicks, Comm: ch.Comm,
			UID: ch.uid, Cgroup: cg, Monitor: ch.monitor.Comm, MonitorPID: ch.monitor.PID}, true, nil
	}
	if e, ok := c.inRecorded(q, exact, members); ok {
		return e, true, nil
	}
	return Evidence{}, false, c.scanErr
}

// inRecorded looks in the cgroup v2 directory the hook recorded for the
// container (its "0::" line) for a live process that is not the tree's
// (its init gone, a process it left), unless a monitor runs there. Only
// the v2 line: a v1 hierarchy the runtime did not move the init into is
// the runtime's own, full of processes that say nothing of the container.
func (c *Checker) inRecorded(q Query, exact []string, members map[int]bool) (Evidence, bool) {
	var path string
	for _, l := range exact {
		if p, ok := strings.CutPrefix(l, "0::"); ok && p != "/" && !c.own[l] && !ownPath(p) {
			path = p
		}
	}
	if path == "" {
		return Evidence{}, false
	}
	mount := cgroup2Mount(c.root)
	if mount == "" {
		return Evidence{}, false
	}
	data, err := os.ReadFile(filepath.Join(mount, filepath.Clean("/"+path), "cgroup.procs"))
	if err != nil {
		return Evidence{}, false
	}
	var pids []int
	in := map[int]bool{}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
			in[pid] = true
		}
	}
	for _, pid := range pids {
		// A cgroup a monitor started from outside it runs in is the
		// monitor's: the runtime left the init in it, and no process
		// there says anything of the container (the children above
		// were judged without the lines they share with their
		// monitor). One the cgroup's own processes started is only
		// named like one.
		if pp, ok := c.parents[pid]; ok && c.monitors[pid] && !in[pp] {
			return Evidence{}, false
		}
	}
	r := proctable.NewReader(c.root)
	defer r.Close()
	for _, pid := range pids {
		id, err := r.Identity(pid)
		if err != nil || id.Zombie() || (id.UID != 0 && id.UID != q.UID) {
			continue
		}
		if c.descendsRead(r, id.Stat, members) {
			continue
		}
		return Evidence{ContainerID: q.ID, Kind: KindCgroup, PID: id.PID, StartTicks: id.StartTicks, Comm: id.Comm, UID: id.UID, Cgroup: path}, true
	}
	return Evidence{}, false
}

// descendsRead is descends for a process the snapshot may not link: its
// ancestors' stat is read where no link is known.
func (c *Checker) descendsRead(r *proctable.Reader, st fingerprint.Stat, members map[int]bool) bool {
	pid, pp := st.PID, st.PPID
	for range 4096 {
		if members[pid] {
			return true
		}
		if pp <= 1 {
			return false
		}
		if c.descends(pp, members) {
			return true
		}
		if _, ok := c.parents[pp]; ok || (c.snap != nil && c.snap.PPIDs != nil && c.snap.Index(pp) >= 0) {
			return false // descends walked the known links to the top
		}
		up, err := r.Stat(pp)
		if err != nil {
			return false
		}
		pid, pp = up.PID, up.PPID
	}
	return false
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted in this
// mount namespace, at its root (/sys/fs/cgroup, or …/unified on a hybrid
// host); "" when it is not.
func cgroup2Mount(root string) string {
	// Users may add mounts (FUSE); the cgroup mounts come early, and a
	// table is read past mountinfo.Max only when they do not.
	isV2 := func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" && m.Root == "/" }
	ms, _ := mountinfo.ReadFor(filepath.Join(root, "self", "mountinfo"), isV2)
	if i := slices.IndexFunc(ms, isV2); i >= 0 {
		return ms[i].Point
	}
	return ""
}

// inContainer reports which of a process's cgroup lines is the container
// id's own: one of the exact lines the hook recorded, or, where none was
// recorded, a path named after the container (NameMatches). kc-watchman's
// own cgroups never are.
func (c *Checker) inContainer(lines []string, id string, exact []string) (string, bool) {
	for _, l := range lines {
		path := linePath(l)
		switch {
		case path == "":
			continue
		case len(exact) > 0:
			if !slices.Contains(exact, l) {
				continue
			}
		case !NameMatches(path, id):
			continue
		}
		// Checked last: nearly every line of nearly every child fails
		// the match above, asked once per stray candidate.
		if c.own[l] || ownPath(path) {
			continue
		}
		return path, true
	}
	return "", false
}

// InContainerCgroup reports whether a process whose /proc/<pid>/cgroup
// reads data is in container id's own cgroup by an engine's naming
// (NameMatches): not its monitor's (libpod-conmon-<id>.scope), nor one
// of kc-watchman's named after it.
func InContainerCgroup(data []byte, id string) bool {
	for _, l := range strings.Split(string(data), "\n") {
		if path := linePath(l); path != "" && NameMatches(path, id) && !ownPath(path) {
			return true
		}
	}
	return false
}

// OtherContainerCgroup reports whether a process whose /proc/<pid>/cgroup
// reads data is in a cgroup an engine named after a container other than
// id (a full 64-hex ID), kc-watchman's own aside.
func OtherContainerCgroup(data []byte, id string) bool {
	for _, l := range strings.Split(string(data), "\n") {
		path := linePath(l)
		if path == "" || ownPath(path) {
			continue
		}
		for _, named := range namedIDs(path) {
			if named != id && containerid.Valid(named) {
				return true
			}
		}
	}
	return false
}

// linePath is the path of a /proc/<pid>/cgroup line
// ("hierarchy:controllers:path"), "" for a line of another form.
func linePath(l string) string {
	_, rest, ok := strings.Cut(l, ":")
	if !ok {
		return ""
	}
	_, path, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return path
}

// ownPath: the cgroups kc-watchman makes for its supervisors (DESIGN
// "Descendants that leave the group")
// hold trees, never containers: kc-watchman/<id> on cgroupfs, named
// after the container it serves, and the systemd scopes in
// kc-watchman.slice. A supervisor's kernel reparented to a container
// monitor (conmon is a subreaper) sits in one and must not pass for the
// container's own process.
func ownPath(path string) bool {
	return strings.Contains(path, "/kc-watchman.slice") || strings.Contains(path, "/kc-watchman-") ||
		strings.Contains(path+"/", "/kc-watchman/")
}

// NameMatches reports whether the cgroup path is named as container id's
// own by an engine's convention (DESIGN "Ground truth must be corroborated"): its last component exactly
// (or the one before crun's "container" subgroup, or before the
// "init.scope" a systemd running as the container's init moves itself
// to). A monitor's cgroup
// (libpod-conmon-<id>.scope, crio-conmon-<id>.scope, podman's "runtime"
// sibling) never matches.
func NameMatches(path, id string) bool {
	if id == "" {
		return false
	}
	name := ownName(path)
	for _, n := range engineNames {
		if len(name) == len(n.prefix)+len(id)+len(n.suffix) && strings.HasPrefix(name, n.prefix) &&
			strings.HasSuffix(name, n.suffix) && name[len(n.prefix):len(name)-len(n.suffix)] == id {
			return true
		}
	}
	return false
}

// engineNames are the engines' names for a container's own cgroup: the
// ID between a prefix and a suffix.
var engineNames = [...]struct{ prefix, suffix string }{
	{"", ""}, {"libpod-", ".scope"}, {"libpod-", ""}, {"libpod-payload-", ""},
	{"docker-", ".scope"}, {"cri-containerd-", ".scope"},
	{"crio-", ".scope"}, {"crio-", ""}, {"nerdctl-", ".scope"},
}

// ownName is the component of a cgroup path an engine names after the
// container: the last, or the one before crun's "container" subgroup or
// a systemd init's "init.scope".
func ownName(path string) string {
	path = strings.TrimSuffix(path, "/")
	last := path[strings.LastIndexByte(path, '/')+1:]
	for _, sub := range []string{"init.scope", "container"} {
		if last == sub {
			path = path[:len(path)-len(last)-1]
			last = path[strings.LastIndexByte(path, '/')+1:]
		}
	}
	return last
}

// namedIDs are every container ID the cgroup path is named after
// (NameMatches holds for exactly these): the Checker indexes a monitor
// child's lines by them once, instead of matching every line against
// every candidate's ID.
func namedIDs(path string) []string {
	name := ownName(path)
	var ids []string
	for _, n := range engineNames {
		if len(name) > len(n.prefix)+len(n.suffix) && strings.HasPrefix(name, n.prefix) && strings.HasSuffix(name, n.suffix) {
			ids = append(ids, name[len(n.prefix):len(name)-len(n.suffix)])
		}
	}
	return ids
}

// descends reports whether pid is, or descends from, one of members.
func (c *Checker) descends(pid int, members map[int]bool) bool {
	for range 4096 { // a bound against a parent map that loops
		if members[pid] {
			return true
		}
		pp, ok := c.parents[pid]
		if !ok && c.snap != nil && c.snap.PPIDs != nil {
			// The snapshot's parent links, where it has them: a map of
			// the whole table would cost every run with a candidate.
			if i := c.snap.Index(pid); i >= 0 {
				pp, ok = int(c.snap.PPIDs[i]), true
			}
		}
		if !ok || pp <= 1 {
			return false
		}
		pid = pp
	}
	return false
}

// ledgerInit: a record of this boot whose init identity (pid and start
// time) is alive, and no poststop ran after the init was recorded.
func (c *Checker) ledgerInit(id string) (Evidence, bool) {
	r := c.records[id]
	if r == nil || r.Init == nil || c.boot == "" || r.BootID != c.boot {
		return Evidence{}, false
	}
	if stopped(r) {
		return Evidence{}, false
	}
	st, err := fingerprint.Revalidate(c.root, fingerprint.Stat{PID: r.Init.PID, StartTicks: r.Init.StartTicks})
	if err != nil || st.Zombie() {
		return Evidence{}, false
	}
	return Evidence{ContainerID: id, Kind: KindLedgerInit, PID: st.PID, StartTicks: st.StartTicks, Comm: st.Comm, UID: 0}, true
}

// stopped reports whether a poststop ran after the last stage that
// recorded the init process.
func stopped(r *ledger.Record) bool {
	post, ok := r.Stages["poststop"]
	if !ok {
		return false
	}
	var init time.Time
	for _, s := range []string{"createRuntime", "prestart", "createContainer", "startContainer", "poststart"} {
		if t := r.Stages[s]; t.After(init) {
			init = t
		}
	}
	return !post.Before(init)
}

// IsMonitor reports whether comm names a container monitor that carries
// its container's ID in argv: podman's conmon, or a containerd shim (comm
// is cut to 15 bytes: "containerd-shim" for containerd-shim-runc-v2).
func IsMonitor(comm string) bool {
	return comm == "conmon" || strings.HasPrefix(comm, "containerd-shim")
}

// Watch is IsMonitor for proctable.Options.Watch: the snapshot a Checker
// reads must be taken with it.
func Watch(comm []byte) bool {
	return string(comm) == "conmon" || bytes.HasPrefix(comm, []byte("containerd-shim"))
}

// scan finds the live children of every live monitor of the snapshot,
// with their cgroups and UIDs: one stat and one cgroup read per child
// (where the snapshot has no parent links, one children file per monitor
// thread), never a /proc listing.
func (c *Checker) scan() error {
	snap := c.snap
	if snap == nil {
		l, err := proctable.List(proctable.Options{Root: c.root, Watch: Watch})
		if err != nil {
			return fmt.Errorf("listing processes for container monitors: %w", err)
		}
		snap = l
	}
	c.own = ownCgroups(c.root)
	r := proctable.NewReader(c.root)
	defer r.Close()
	procs, err := snap.WatchedAll(r)
	if err != nil {
		return fmt.Errorf("looking for container monitors: %w", err)
	}
	c.snap = snap
	c.parents = map[int]int{}
	monitors := map[int]proctable.Proc{}
	for _, p := range procs {
		if !p.Zombie && IsMonitor(p.Comm) {
			monitors[p.PID] = p
			c.parents[p.PID] = p.PPID
		}
	}
	c.monitors = make(map[int]bool, len(monitors))
	for pid, p := range monitors {
		c.monitors[pid] = true
		if p.UID < 0 {
			// The /proc lister learns no UID: read it, for the rule on
			// another user's children above.
			if id, err := r.IdentitySince(pid, p.StartTicks); err == nil {
				p.UID = id.UID
				monitors[pid] = p
			}
		}
	}
	if len(monitors) == 0 {
		return nil
	}
	// A child the task iterator listed is taken as it saw it (comm,
	// start, parent); any other's stat is read.
	type kid struct {
		pid, at int // at: its index in snap, -1 for none
	}
	var kids []kid
	if snap.PPIDs != nil && !snap.PPIDsPartial {
		for i, pid := range snap.PIDs {
			if _, ok := monitors[int(snap.PPIDs[i])]; ok && snap.PGIDs[i] >= 0 {
				kids = append(kids, kid{pid, i})
			}
		}
	} else {
		for pid := range monitors {
			for _, k := range childrenOf(c.root, pid) {
				kids = append(kids, kid{k, -1})
			}
		}
	}
	for _, k := range kids {
		pid := k.pid
		st, err := c.stat(r, k.pid, k.at)
		if err != nil || st.Zombie() {
			continue
		}
		mon, ok := monitors[st.PPID]
		if !ok {
			continue // reparented since the snapshot
		}
		c.parents[pid] = st.PPID
		uid := -1
		if k.at >= 0 && snap.UIDs != nil {
			uid = int(snap.UIDs[k.at])
		}
		if uid < 0 {
			id, err := r.IdentitySince(pid, st.StartTicks)
			if err != nil {
				continue
			}
			uid = id.UID
		}
		data, err := r.ReadFile(pid, "cgroup")
		if err != nil {
			continue
		}
		ch := child{Stat: st, uid: uid, monitor: mon}
		for l := range cgroupLines(data) {
			// In a hierarchy's root is in no container: on a hybrid
			// host a v1 line can be "/" for every process.
			if !strings.HasSuffix(l, ":/") {
				ch.cgroups = append(ch.cgroups, l)
			}
		}
		c.children = append(c.children, ch)
	}
	c.index()
	return nil
}

// index fills byName and byLine from children.
func (c *Checker) index() {
	c.byName, c.byLine = map[string][]int{}, map[string][]int{}
	add := func(m map[string][]int, k string, i int) {
		if at := m[k]; len(at) == 0 || at[len(at)-1] != i {
			m[k] = append(at, i)
		}
	}
	for i, ch := range c.children {
		for _, l := range ch.cgroups {
			path := linePath(l)
			if path == "" {
				continue
			}
			add(c.byLine, l, i)
			for _, id := range namedIDs(path) {
				add(c.byName, id, i)
			}
		}
	}
}

// candidates are the positions in children of those with a line
// inContainer could take for container id: one of exact's lines, or,
// with none recorded, a line named after id.
func (c *Checker) candidates(id string, exact []string) []int {
	if len(exact) == 0 {
		return c.byName[id]
	}
	var out []int
	for _, l := range exact {
		out = append(out, c.byLine[l]...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// notMonitors is ch's cgroup lines but those it shares with its monitor:
// a hierarchy the runtime left the child in with its monitor is no
// container's own, and a recorded init's line shared with every other
// monitor child would make it evidence of every container. The
// monitor's cgroup is read only for a child whose lines could be the
// container asked about, and once.
func (c *Checker) notMonitors(ch child) []string {
	if c.monCgroups == nil {
		c.monCgroups = map[int]map[string]bool{}
	}
	mcg, ok := c.monCgroups[ch.monitor.PID]
	if !ok {
		mcg = map[string]bool{}
		if d, err := os.ReadFile(filepath.Join(c.root, strconv.Itoa(ch.monitor.PID), "cgroup")); err == nil {
			mcg = cgroupLines(d)
		}
		c.monCgroups[ch.monitor.PID] = mcg
	}
	var out []string
	for _, l := range ch.cgroups {
		if !mcg[l] {
			out = append(out, l)
		}
	}
	return out
}

// stat is what the snapshot's task iterator saw of the process at
// index at of the snapshot, or, where it saw nothing (a /proc listing),
// its stat file.
func (c *Checker) stat(r *proctable.Reader, pid, at int) (fingerprint.Stat, error) {
	if at >= 0 && c.snap.Starts != nil {
		if comm, zombie, ok := c.snap.Seen(at); ok {
			st := fingerprint.Stat{PID: pid, Comm: comm, PPID: int(c.snap.PPIDs[at]), PGID: int(c.snap.PGIDs[at]), StartTicks: c.snap.Starts[at]}
			if zombie {
				st.State = 'Z'
			}
			return st, nil
		}
	}
	return r.Stat(pid)
}

// childrenOf reads a process's children from each of its threads'
// children files (a multi-threaded shim forks from any thread).
func childrenOf(root string, pid int) []int {
	tasks, err := os.ReadDir(filepath.Join(root, strconv.Itoa(pid), "task"))
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// cgroupLines are the lines of a /proc/<pid>/cgroup file.
func cgroupLines(data []byte) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			out[l] = true
		}
	}
	return out
}

// ownCgroups are this process's own cgroup lines: a container whose
// cgroup is kc-watchman's is no evidence of anything.
func ownCgroups(root string) map[string]bool {
	data, err := os.ReadFile(filepath.Join(root, "self", "cgroup"))
	if err != nil {
		return nil
	}
	return cgroupLines(data)
}
