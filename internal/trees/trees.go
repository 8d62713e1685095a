// Package trees finds supervisor trees: process groups that hold a process
// carrying a container ID in its argv (an anchor) and at least one process
// whose comm is in the supervisor set (DESIGN "Identity rules").
//
// A host has tens of thousands of processes and almost none of them matter,
// so the scan reads files only where a decision needs them: one getpgid(2)
// per process to group them, the leader's stat per group, and full
// identities only for the few candidate groups. Package proctable lists
// the processes (with the BPF task iterator where it can) and reads those
// files with one openat(2), read(2) and close(2) each into a reused buffer;
// this package decides. Options.Full switches to the simple scan that reads every
// process through package fingerprint; both make the same decisions about
// what may be signalled, which the tests check.
package trees

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
)

// WrapperComm is the comm of `kc-hook supervise`, which always counts as a
// supervisor.
const WrapperComm = "kc-hook"

// DefaultComm is the comm of Kallichore's supervisor: the default of
// --supervisor-comm in both commands and of the sweep.
const DefaultComm = "kcserver"

// ClockTicks is USER_HZ, the unit of start times in /proc/<pid>/stat. It is
// 100 on every Linux architecture kc-watchman runs on.
const ClockTicks = 100

// Key is a process identity within its group, as recorded in the ledger.
type Key struct {
	PID        int
	StartTicks uint64
	PGID       int
}

// Options configure a scan.
type Options struct {
	// Root is the procfs mount; default /proc. Only the host's /proc can
	// use getpgid(2); any other root is read from files.
	Root string
	// Comms is the supervisor set (comm values). WrapperComm is implied.
	Comms []string
	// Known attributes processes to containers by exact identity, for
	// groups whose anchor has died (a crashed kcserver leaves its kernels,
	// which carry no container ID). Built from ledger snapshots.
	Known map[Key]string
	// Full reads every process instead of only what decisions need.
	Full bool
	// Now overrides the clock for age computations (tests).
	Now func() time.Time
	// Lister chooses how the fast scan lists the host's processes.
	Lister proctable.Lister
	// Program is a loaded iterator program to list with
	// (proctable.Options.Program).
	Program *taskiter.Program
	// LayoutCache is proctable.Options.LayoutCache.
	LayoutCache string
	// Only, when not empty, asks for the trees of these containers alone
	// (kc-hook's poststop wants one container's): a candidate group is
	// then read in full only if a member's argv carries one of the IDs
	// or a member's PID is in Known. Other groups are dropped after one
	// cmdline read per member, which is what makes a hook's scan cheap;
	// with Partial, a group whose leader names another container (or is
	// its by Known) is a Partial tree of it, and Complete reads the argv
	// only of its members Known does not give to that container.
	// Trees of other containers that share a group with one of these are
	// still reported, as without Only (but see ByLeader). Such a scan that finds no tree
	// also skips confirming the BPF task iterator's listing against
	// /proc (proctable.Listing.Confirm): it has nothing to act on.
	Only map[string]bool

	// Partial leaves a group led by a live supervisor whose argv names
	// one container (or Known gives it one), and no other by the
	// ledger, unread but for the leader's argv and stat (none if known):
	// the tree is built from the listing (Tree.Partial), and its
	// caller reads it in full (Completer) only if it must decide
	// more about it than that it is that container's — a reconcile,
	// for a container the engines do not call live. Only a listing of
	// the BPF task iterator carries what the members' files would tell;
	// on any other, and for a member the iterator did not list, the
	// group is read in full as without Partial.
	Partial bool

	// ByLeader, with Only, takes a group led by a live supervisor whose
	// argv names one container not in Only, and none of whose members
	// Known gives to one in Only, for that container's after one cmdline
	// read, where Only's filter reads one per member. A member carrying
	// a wanted ID would make the group ambiguous, never signalled: a
	// scan that reaps only the wanted containers' trees (kc-hook's
	// poststop) leaves it to its leader's container's poststop, and to
	// reconcile once that container is gone, which read it in full and
	// report it (Stats.OthersLed lists such groups).
	ByLeader bool

	// Watch is handed to the listing (proctable.Options.Watch): the
	// processes it picks are kept whole in the snapshot ScanSnapshot
	// returns, for the decisions after the scan (container monitors).
	Watch func(comm []byte) bool

	// pipeline overrides how the fast scan's /proc listing splits its
	// work (tests force several goroutines and many batches on a small
	// process table).
	pipeline proctable.Pipeline
	// iterHide drops processes from the BPF task iterator's listing, as
	// the kernel has been seen to (tests).
	iterHide func(pid int) bool
}

// Tree is one supervisor tree (or a group that looks like one but must not
// be touched; see Ambiguous and Foreign).
type Tree struct {
	PGID int
	// ContainerID is the container the tree belongs to; empty when
	// Ambiguous.
	ContainerID string
	// ContainerIDs lists every container ID seen in the group: from
	// anchors' argv and from ledger matches.
	ContainerIDs []string
	// Ambiguous: members carry different container IDs. Never signalled.
	Ambiguous bool
	// Foreign: the group's leader is alive and not in the supervisor set,
	// anchor or not (a shell that ran a supervisor by hand, a wrapper
	// --supervisor-comm does not name). Never signalled. Only the full
	// scan reports these.
	Foreign bool
	// ByLedger: the container was known only from a ledger snapshot.
	ByLedger bool
	// UID is the real UID shared by all members, or -1 when they differ
	// or one left out of them (unreadable) runs setuid.
	UID int
	// Age is the youngest dating member's age (see dating); AgeKnown is
	// false when a member's could not be read (the tree may be
	// mid-create).
	Age      time.Duration
	AgeKnown bool
	// Oldest is the oldest member's age (with AgeKnown): a tree whose
	// oldest member is younger than a container's death was started after
	// it.
	Oldest  time.Duration
	Members []fingerprint.Identity
	// Escaped are live descendants of members that left the group (a
	// setsid child, a daemon): members all the same, killed one by one
	// since no killpg reaches them (DESIGN "Descendants that leave the group").
	Escaped []fingerprint.Identity
	// Withheld are descendants outside the group of another UID or
	// carrying another container's ID: reported, never signalled.
	Withheld []fingerprint.Identity
	// Partial: only the leader's argv and stat, or nothing where Known
	// gave its container, were read (Options.Partial). The container is the
	// leader's; Members come from the listing and carry no argv but the
	// leader's (if read), so another container's ID on a member
	// (which would make the tree Ambiguous) is not ruled out. Such a tree
	// may be spared as it stands; anything else reads it with Complete.
	Partial bool
	// callerBelow: the calling process is a descendant of the tree (see
	// HoldsCaller).
	callerBelow bool
	// rest and cand complete a Partial tree: the scan's and its group's.
	rest *completion
	cand *candidate
}

// Stats reports how much a scan read, for benchmarks and logs.
type Stats struct {
	// Lister is how the processes were listed: "bpf", "proc" or, for
	// the full scan, "full".
	Lister string
	// ListerFallback says why ListAuto did not use the BPF task
	// iterator; empty when it did or was not asked to.
	ListerFallback string
	// IterConfirmed: the BPF task iterator's listing was checked
	// against /proc's (its census could not vouch for it).
	IterConfirmed bool
	// IterMissed counts the processes /proc listed and the BPF task
	// iterator did not (they were added to the scan from /proc).
	IterMissed int
	Processes  int
	Groups     int
	StatReads  int
	FullReads  int
	// ArgvReads counts the cmdline reads outside full identity reads
	// (a leader's for Options.Partial, members' for Only's filter).
	ArgvReads int
	// Stalled lists, in order, the processes whose argv was not read
	// because their memory did not answer (fingerprint.ErrStalled). A
	// group is then read without them, of unknown age (reconcile does not
	// act on it; the hook's poststop reaps its container's group as
	// found through the other members), or left out if nothing else ties
	// it to a container. A Completer's reads are in its Stalled.
	// StalledNote words it for a log.
	Stalled []int
	// OthersLed lists, in order, the groups ByLeader left to the
	// container their leader names, unread: whoever sweeps a wanted
	// container's cgroup spares their processes, as it would a group
	// refused as ambiguous.
	OthersLed []int
	Duration  time.Duration
}

// StalledNote sums up Stalled for a warning: how many, and the first
// few PIDs (a user can make the list as long as his processes).
func (st Stats) StalledNote() string {
	const few = 8
	var b strings.Builder
	fmt.Fprintf(&b, "%d: ", len(st.Stalled))
	for i, pid := range st.Stalled[:min(len(st.Stalled), few)] {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(strconv.Itoa(pid))
	}
	if len(st.Stalled) > few {
		b.WriteString(" …")
	}
	return b.String()
}

// Scan finds the supervisor trees on the host.
func Scan(opt Options) ([]Tree, Stats, error) {
	ts, stats, _, err := ScanSnapshot(opt)
	return ts, stats, err
}

// ScanSnapshot is Scan that also returns the listing it decided from:
// the process table the rest of a decision reads instead of listing
// /proc again (DESIGN "One view of the host"). It is nil for the full scan (Options.Full),
// which reads every process's files and keeps no listing. A scan for
// some containers only (Options.Only) that found nothing to act on may
// return a listing the task iterator's census could not vouch for and
// that was not confirmed against /proc (see Scan); Listing.Pending
// says so.
func ScanSnapshot(opt Options) ([]Tree, Stats, *proctable.Listing, error) {
	start := time.Now()
	if opt.Root == "" {
		opt.Root = fingerprint.DefaultRoot
	}
	// "/proc/" is the host's /proc too: getpgid(2) and the task
	// iterator apply to it.
	opt.Root = filepath.Clean(opt.Root)
	comms := map[string]bool{WrapperComm: true}
	for _, c := range opt.Comms {
		comms[c] = true
	}
	var stats Stats
	uptime, uptimeErr := readUptime(opt.Root)

	var (
		ss      []*scanner
		cands   []candidate
		listing *proctable.Listing
		err     error
	)
	if opt.Full {
		ss = []*scanner{{opt: opt, comms: comms}}
		stats.Lister = "full"
		cands, err = ss[0].fullGroups(&stats)
	} else {
		listing, cands, ss, err = listGroups(opt, comms, &stats)
		for _, s := range ss {
			defer s.proc.Close()
		}
	}
	if err != nil {
		return nil, stats, nil, err
	}
	if len(opt.Only) > 0 {
		known := make(map[int]bool, len(opt.Known))
		for k := range opt.Known {
			known[k.PID] = true
		}
		for _, s := range ss {
			s.knownPIDs = known
		}
	}

	// A listing the BPF task iterator could not vouch for is checked
	// against /proc's before the scan answers; /proc is listed while the
	// candidates are read. A scan for some containers only (the hook's)
	// lists it only if it found one of their trees or has ledger
	// identities for them: otherwise it has nothing to act on (and
	// nothing it could forget: the hook records what it found), and the
	// janitor's scans are the backstop for a tree whose every sign the
	// iterator missed.
	pending := listing != nil && listing.Pending()
	if pending && len(opt.Only) == 0 {
		listing.Prefetch()
	}
	found := examineAll(ss, cands)
	if pending && (len(opt.Only) == 0 || len(opt.Known) > 0 || slices.ContainsFunc(found, func(t *Tree) bool { return t != nil })) {
		grouped, err := listing.Confirm()
		if err != nil {
			return nil, stats, nil, err
		}
		listingStats(listing, &stats)
		if grouped > 0 {
			found = reexamine(ss, cands, found, ss[0].candidates(listing, &stats))
		}
	}
	var out []Tree
	fin := &completion{opt: opt, comms: comms, listing: listing, uptime: uptime, uptimeErr: uptimeErr}
	if len(ss) > 0 {
		fin.knownPIDs = ss[0].knownPIDs
	}
	for _, t := range found {
		if t == nil {
			continue
		}
		fin.finish(t)
		if t.Partial {
			t.rest = fin
		}
		out = append(out, *t)
	}
	if listing != nil {
		stats.StatReads += listing.StatReads
	}
	for _, s := range ss {
		stats.StatReads += s.stats.StatReads
		stats.FullReads += s.stats.FullReads
		stats.ArgvReads += s.stats.ArgvReads
		stats.Stalled = append(stats.Stalled, s.stats.Stalled...)
		stats.OthersLed = append(stats.OthersLed, s.stats.OthersLed...)
	}
	slices.Sort(stats.Stalled)
	stats.Stalled = slices.Compact(stats.Stalled)
	slices.Sort(stats.OthersLed)
	stats.Duration = time.Since(start)
	return out, stats, listing, nil
}

// completion is what a scan keeps to read its Partial trees in full.
type completion struct {
	opt       Options
	comms     map[string]bool
	knownPIDs map[int]bool
	listing   *proctable.Listing
	uptime    time.Duration
	uptimeErr error

	once sync.Once
	kids childIndex
}

// finish adds what a tree's decisions read besides its members: ages
// and, for a tree that may be signalled, its descendants.
func (c *completion) finish(t *Tree) {
	t.AgeKnown = t.AgeKnown && c.uptimeErr == nil
	if t.Signalable() {
		c.once.Do(func() { c.kids = indexChildren(c.listing) })
		addDescendants(c.opt.Root, t, c.kids)
	}
	if t.AgeKnown {
		t.Age, _ = ages(t.dating(c.opt.Known), c.uptime)
		_, t.Oldest = ages(t.Members, c.uptime)
	}
}

// dating are the members whose start dates the tree (Age): its leader
// and the members that name its container, by argv or the ledger. A
// kernel's short-lived children (a `while sleep` loop, a notebook's
// subprocesses) name none; counted, they kept a gone container's tree
// younger than --min-age for as long as it ran. A young member that does
// name it may be a tree in the making, and counts. A partial tree's
// members' argv is unread: they all count.
func (t Tree) dating(known map[Key]string) []fingerprint.Identity {
	if t.Partial {
		return t.Members
	}
	var out []fingerprint.Identity
	for _, m := range t.Members {
		_, recorded := known[Key{PID: m.PID, StartTicks: m.StartTicks, PGID: t.PGID}]
		if m.PID == t.PGID || recorded || len(containerid.FromArgv(m.Argv)) > 0 {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return t.Members
	}
	return out
}

// Completer reads Partial trees in full, one after the other, on one
// /proc reader per scan; Close releases them. It is not safe for
// concurrent use; several Completers may read one scan's trees at once.
type Completer struct {
	scanners map[*completion]*scanner
}

// Complete reads a Partial tree in full, as a scan without
// Options.Partial would have: the members of its group as the scan
// listed them, each still the process listed. The group may turn out to
// be no tree any more (its members gone) or another tree (Ambiguous,
// another container's by a member's argv); ok is false for none. A tree
// that is not Partial is returned as it is; a Partial one built by hand,
// with nothing to read it by, is no tree.
func (cp *Completer) Complete(t Tree) (Tree, bool) {
	if !t.Partial {
		return t, true
	}
	if t.rest == nil || t.cand == nil {
		return Tree{}, false
	}
	c := t.rest
	s := cp.scanners[c]
	if s == nil {
		opt := c.opt
		opt.Partial = false
		s = &scanner{opt: opt, comms: c.comms, knownPIDs: c.knownPIDs, proc: proctable.NewReader(opt.Root), listing: c.listing}
		if cp.scanners == nil {
			cp.scanners = map[*completion]*scanner{}
		}
		cp.scanners[c] = s
	}
	// A tree of a container Options.Only does not want is read only as
	// far as Only's filter: it matters only if a member carries a
	// wanted ID. The leader's argv, if the scan read it, carries none.
	// A member the ledger gives to the same container (a known leader
	// too) is not read: it is that container's by the identity rule a
	// reap of it follows (DESIGN "Ledger"), whatever it has exec'd
	// since. So such a member that exec'd with a wanted ID no longer
	// makes the tree ambiguous, nor spares that container's cgroup.
	if only := s.opt.Only; len(only) > 0 && !slices.ContainsFunc(t.ContainerIDs, func(id string) bool { return only[id] }) {
		others := make([]int, 0, len(t.cand.pids))
		for k, pid := range t.cand.pids {
			if pid == t.PGID || (k < len(t.cand.starts) && s.opt.Known[Key{PID: pid, StartTicks: t.cand.starts[k], PGID: t.PGID}] == t.ContainerID) {
				continue
			}
			others = append(others, pid)
		}
		if !s.mayHoldOnly(others, 0, nil) {
			return Tree{}, false
		}
	}
	full, ok := s.examine(*t.cand)
	if !ok {
		return Tree{}, false
	}
	c.finish(&full)
	return full, true
}

// Stalled lists, in order, the processes whose memory did not answer
// while the completions read them, as Stats.Stalled does for a scan: the
// trees they are in were read without them.
func (cp *Completer) Stalled() []int {
	var out []int
	for _, s := range cp.scanners {
		out = append(out, s.stats.Stalled...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Close releases the readers.
func (cp *Completer) Close() {
	for _, s := range cp.scanners {
		s.proc.Close()
	}
	cp.scanners = nil
}

// examineAll examines the candidates on the scanners' goroutines.
func examineAll(ss []*scanner, cands []candidate) []*Tree {
	found := make([]*Tree, len(cands))
	workers := len(ss)
	parallel(workers, func(w int) {
		for i := w; i < len(cands); i += workers {
			if t, ok := ss[w].examine(cands[i]); ok {
				found[i] = &t
			}
		}
	})
	return found
}

// reexamine examines the candidates of a listing completed by Confirm:
// a group /proc added no member to, listed as before, keeps what its
// examination found (a busy host's census fails often, and the few
// processes /proc adds must not cost a second read of every tree);
// the others are examined again.
func reexamine(ss []*scanner, old []candidate, found []*Tree, cands []candidate) []*Tree {
	byPGID := make(map[int]int, len(old))
	for i, c := range old {
		byPGID[c.pgid] = i
	}
	out := make([]*Tree, len(cands))
	var again []candidate
	var at []int
	for i, c := range cands {
		if j, ok := byPGID[c.pgid]; ok && sameCandidate(old[j], c) {
			out[i] = found[j]
			continue
		}
		again = append(again, c)
		at = append(at, i)
	}
	if len(again) == 0 {
		return out
	}
	for k, t := range examineAll(ss, again) {
		out[at[k]] = t
	}
	return out
}

// sameCandidate says whether a and b are one group listed alike.
func sameCandidate(a, b candidate) bool {
	return a.pgid == b.pgid && a.leader == b.leader && a.listed == b.listed &&
		slices.Equal(a.pids, b.pids) && slices.Equal(a.starts, b.starts)
}

// candidate is a process group the decisions read: its members in the
// order they were listed, and what is known of its leader.
type candidate struct {
	pgid int
	pids []int
	// starts are the members' start times as listed, 0 where unknown
	// (nil: none known).
	starts []uint64
	leader leaderMark
	// at are the members' indexes in the listing (nil for the full
	// scan's groups).
	at []int
	// listed: the listing had the leader (or failed to read it). When
	// it did not, examine asks /proc before taking the group for
	// leaderless: a listing is a snapshot, and the kernel's task
	// iterator has been seen to leave a process out (PID 1 on some
	// hosts), which must not turn a foreign group into a candidate.
	listed bool
}

// leaderMark is what a stat read tells of a group leader.
type leaderMark struct {
	// live: the leader is in its group and not a zombie.
	live bool
	// sup: live, and in the supervisor set.
	sup bool
	// wrapper: sup on its comm alone (kc-hook), to be settled by its
	// argv when the group's members are read (see supervisor): reading
	// it here would read the same cmdline twice.
	wrapper bool
}

// parallel runs f(0) … f(n-1) concurrently and waits for them.
func parallel(n int, f func(w int)) {
	var wg sync.WaitGroup
	for w := 1; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(w)
		}()
	}
	f(0)
	wg.Wait()
}

// scanner reads and decides for one goroutine of a scan.
type scanner struct {
	opt   Options
	comms map[string]bool
	// knownPIDs are the PIDs of Options.Known, for Only's filter.
	knownPIDs map[int]bool
	stats     Stats
	// proc is the fast scan's reader; nil for the full scan, which reads
	// through package fingerprint.
	proc *proctable.Reader
	// listing is the fast scan's; nil for the full scan.
	listing *proctable.Listing
}

// readStat reads pid's stat: through the fast reader, or (full scan)
// fingerprint.ReadStat.
func (s *scanner) readStat(pid int) (fingerprint.Stat, error) {
	s.stats.StatReads++
	if s.proc != nil {
		return s.proc.Stat(pid)
	}
	return fingerprint.ReadStat(s.opt.Root, pid)
}

// readArgv reads pid's argv: through the fast reader, or (full scan)
// fingerprint.ReadArgv.
func (s *scanner) readArgv(pid int) ([]string, error) {
	s.stats.ArgvReads++
	var argv []string
	var err error
	if s.proc != nil {
		argv, err = s.proc.Argv(pid)
	} else {
		argv, err = fingerprint.ReadArgv(s.opt.Root, pid)
	}
	return argv, s.noteStalled(pid, err)
}

// noteStalled records pid in the stats if err says its memory did not
// answer, and returns err.
func (s *scanner) noteStalled(pid int, err error) error {
	if errors.Is(err, fingerprint.ErrStalled) {
		s.stats.Stalled = append(s.stats.Stalled, pid)
	}
	return err
}

// readIdentityListed is readIdentity for a process listed with the start
// time listed (0: unknown). Knowing it spares the fast reader a stat read:
// it reads status and cmdline, then stat, and only a process still
// started at listed time, the listed one, is taken (see
// fingerprint.ReadSince). A process whose PID was reused since the
// listing reads as gone: it was not in the snapshot.
func (s *scanner) readIdentityListed(pid int, listed uint64) (fingerprint.Identity, error) {
	if listed == 0 || s.proc == nil {
		return s.readIdentity(pid)
	}
	s.stats.FullReads++
	id, err := s.proc.IdentitySince(pid, listed)
	return id, s.noteStalled(pid, err)
}

// readIdentity reads pid's full identity: through the fast reader, or
// (full scan) fingerprint.Read.
func (s *scanner) readIdentity(pid int) (fingerprint.Identity, error) {
	s.stats.FullReads++
	var id fingerprint.Identity
	var err error
	if s.proc != nil {
		id, err = s.proc.Identity(pid)
	} else {
		id, err = fingerprint.Read(s.opt.Root, pid)
	}
	return id, s.noteStalled(pid, err)
}

// joinUID folds a member's UID into a tree's: -2 none yet, -1 mixed or
// unknown.
func joinUID(tree, member int) int {
	switch {
	case member < 0:
		return -1
	case tree == -2:
		return member
	case tree != member:
		return -1
	}
	return tree
}

// statusUID reads pid's UID from its status, which takes no lock the
// process can hold (its memory's does): -1 when it cannot be read, or
// when its effective or saved UID is not its real one (a setuid program:
// left out of the members, no later check would see it run as another).
// here is false when pid is gone, or another process than the one listed
// (started at listed, when known).
func (s *scanner) statusUID(pid int, listed uint64) (uid int, here bool) {
	data, err := fingerprint.Dir(s.opt.Root).ReadFile(pid, "status")
	if errors.Is(err, fingerprint.ErrNotFound) {
		return -1, false
	}
	if err == nil {
		var ids [3]int
		if _, ids, err = fingerprint.ParseStatus(data); err == nil {
			uid = fingerprint.SoleUID(ids)
		}
	}
	if listed != 0 {
		st, serr := s.readStat(pid)
		if errors.Is(serr, fingerprint.ErrNotFound) || serr == nil && st.StartTicks != listed {
			return -1, false
		}
	}
	if err != nil {
		return -1, true
	}
	return uid, true
}

// leader reads the stat of a process that leads its group.
func (s *scanner) leader(pid int) leaderMark {
	st, err := s.readStat(pid)
	l := proctable.Leader{PID: pid, State: proctable.LeaderOf(pid, st, err), Comm: st.Comm}
	return s.mark(l)
}

// unreadableLeader stands for a leader whose stat could not be read for
// another reason than its being gone (out of descriptors, an I/O error,
// garbled data). It may well be a live shell that ran a supervisor by
// hand, so its group is taken as foreign: reported, never signalled.
var unreadableLeader = leaderMark{live: true}

// fullGroups is the simple grouping the full scan uses as the reference:
// every process's stat, and every group a candidate, so that foreign
// groups are reported too.
func (s *scanner) fullGroups(stats *Stats) ([]candidate, error) {
	pids, err := proctable.PIDs(s.opt.Root)
	if err != nil {
		return nil, err
	}
	stats.Processes = len(pids)
	groups := make(map[int][]int, len(pids)/2)
	// A process whose stat cannot be read has no known group; if it
	// leads one, that group must not look leaderless.
	unreadable := map[int]bool{}
	for _, pid := range pids {
		st, err := s.readStat(pid)
		if err != nil && !errors.Is(err, fingerprint.ErrNotFound) {
			unreadable[pid] = true
		}
		if err != nil || st.PGID <= 0 {
			continue // gone, or a kernel thread
		}
		groups[st.PGID] = append(groups[st.PGID], pid)
	}
	stats.Groups = len(groups)
	cands := make([]candidate, 0, len(groups))
	for pgid, pids := range groups {
		c := candidate{pgid: pgid, pids: pids, listed: true}
		switch {
		case slices.Contains(pids, pgid):
			c.leader = s.leader(pgid)
		case unreadable[pgid]:
			c.leader = unreadableLeader
		default:
			c.listed = false
		}
		cands = append(cands, c)
	}
	slices.SortFunc(cands, func(a, b candidate) int { return a.pgid - b.pgid })
	return cands, nil
}

// examine decides whether a group is a candidate and, if so, reads it.
func (s *scanner) examine(c candidate) (Tree, bool) {
	pgid, pids := c.pgid, c.pids
	if !c.listed {
		c.leader = s.leader(pgid)
	}
	leaderLive, leaderSup := c.leader.live, c.leader.sup

	// A group led by a live non-supervisor is never ours to signal. The
	// fast scan stops here; the full scan reads it to report it.
	if leaderLive && !leaderSup && !s.opt.Full {
		return Tree{}, false
	}
	// Before Only's filter: a group whose leader names another
	// container is read through the leader alone, and its members' argv
	// only if that container turns out not live (Completer).
	if s.opt.Partial && leaderLive && leaderSup {
		if t, ok := s.partial(c); ok {
			return t, true
		}
	}
	var leaderArgv []string
	if s.opt.ByLeader && len(s.opt.Only) > 0 && leaderLive {
		var other bool
		if leaderArgv, other = s.ledByAnother(c); other {
			s.stats.OthersLed = append(s.stats.OthersLed, pgid)
			return Tree{}, false
		}
	}
	if len(s.opt.Only) > 0 && !s.mayHoldOnly(pids, pgid, leaderArgv) {
		return Tree{}, false
	}
	if !leaderSup {
		if !s.interesting(pgid, pids) {
			return Tree{}, false
		}
	}

	t := Tree{PGID: pgid, UID: -2, AgeKnown: true}
	for i, pid := range pids {
		var listed uint64
		if c.starts != nil {
			listed = c.starts[i]
		}
		id, err := s.readIdentityListed(pid, listed)
		if err != nil {
			if !errors.Is(err, fingerprint.ErrNotFound) {
				t.AgeKnown = false
				// Left out of the members, it is still in the group
				// a kill reaches: its owner counts all the same.
				if uid, here := s.statusUID(pid, listed); here {
					t.UID = joinUID(t.UID, uid)
				}
			}
			continue
		}
		if id.PGID != pgid || id.Zombie() {
			continue
		}
		t.Members = append(t.Members, id)
		t.UID = joinUID(t.UID, id.UID)
		for _, cid := range containerid.FromArgv(id.Argv) {
			t.addID(cid)
		}
		if cid, ok := s.opt.Known[Key{PID: id.PID, StartTicks: id.StartTicks, PGID: pgid}]; ok {
			if !slices.Contains(t.ContainerIDs, cid) {
				t.ByLedger = true
			}
			t.addID(cid)
		}
	}
	if c.leader.wrapper {
		// Settled now from the leader's argv, as supervisor would
		// have at the listing; a leader that could not be read is no
		// supervisor, so its group is at most foreign.
		leaderSup = false
		for _, m := range t.Members {
			if m.PID == pgid {
				leaderSup = s.supervisor(m.PID, m.Comm, m.Argv)
			}
		}
		if leaderLive && !leaderSup && !s.opt.Full {
			return Tree{}, false
		}
	}
	if len(t.Members) == 0 || !s.hasSupervisorOrKnown(t) {
		return Tree{}, false
	}
	// A leader that read as gone, elsewhere or a zombie cannot read as a
	// live member now, short of a flaky first read; if it does, this read
	// decides, and a live leader outside the supervisor set settles the
	// group as foreign here too.
	if !leaderLive {
		for _, m := range t.Members {
			if m.PID == pgid {
				leaderLive, leaderSup = true, s.supervisor(m.PID, m.Comm, m.Argv)
			}
		}
		if leaderLive && !leaderSup && !s.opt.Full {
			return Tree{}, false
		}
	}
	if t.UID == -2 {
		t.UID = -1
	}
	// DESIGN "Identity rules" calls a group foreign when its live leader is neither an
	// anchor nor a supervisor. kc-watchman is stricter: any live leader
	// outside the supervisor set makes the group foreign, anchor or not.
	// A wrapper that leads its supervisor's group must be named in the
	// supervisor set to be reaped; this keeps the fast scan, which never
	// reads such groups, in agreement with the full one.
	t.Foreign = leaderLive && !leaderSup
	switch len(t.ContainerIDs) {
	case 0:
		// A supervisor with no container ID (e.g. a desktop Positron's own
		// kcserver) is not a supervisor tree: nothing ties it to a
		// container, so it is never ours.
		return Tree{}, false
	case 1:
		t.ContainerID = t.ContainerIDs[0]
		if t.ByLedger {
			t.ByLedger = !anyAnchor(t.Members)
		}
	default:
		t.Ambiguous = true
	}
	return t, true
}

// partial builds the tree of a group led by a live supervisor from the
// listing and its leader's argv alone (Options.Partial); ok is false
// where it cannot, and the group is then read in full. The leader's stat
// is read after its argv: the argv is the listed leader's only if the
// PID was not reused in between.
//
// A leader the ledger knows (Options.Known: same PID, start time and
// group), listed with a supervisor's comm, is its container's without a
// file read, by the identity rule the ledger is for (DESIGN "Ledger"); a tree
// whose container is not live is read in full before any decision, the
// leader's argv included. On a host of many live containers this is most
// of a run's reads. The price: a known leader of a live container that
// exec'd with another container's ID in its argv is that live
// container's (spared), not ambiguous, until its container dies.
func (s *scanner) partial(c candidate) (Tree, bool) {
	l := s.listing
	if l == nil || l.UIDs == nil || l.PPIDs == nil || len(c.at) != len(c.pids) || len(c.starts) != len(c.pids) {
		return Tree{}, false
	}
	lead := slices.Index(c.pids, c.pgid)
	if lead < 0 {
		return Tree{}, false
	}
	known, byLedger := s.opt.Known[Key{PID: c.pgid, StartTicks: c.starts[lead], PGID: c.pgid}]
	var argv []string
	var st fingerprint.Stat
	ids := []string{known}
	if byLedger {
		// The listing says as much as a stat read would for a tree
		// spared as live, and a tree that is not is read in full.
		if comm, zombie, seen := l.Seen(c.at[lead]); !seen || zombie || !s.comms[comm] {
			return Tree{}, false
		}
	} else {
		var err error
		if argv, err = s.readArgv(c.pgid); err != nil {
			return Tree{}, false
		}
		st, err = s.readStat(c.pgid)
		if err != nil || st.StartTicks != c.starts[lead] || st.PGID != c.pgid || st.Zombie() || !s.supervisor(c.pgid, st.Comm, argv) {
			return Tree{}, false
		}
		ids = containerid.FromArgv(argv)
	}
	if len(ids) != 1 {
		return Tree{}, false
	}
	t := Tree{PGID: c.pgid, UID: -2, AgeKnown: true, ContainerID: ids[0], ContainerIDs: ids, Partial: true, cand: &c}
	for k, pid := range c.pids {
		i := c.at[k]
		comm, zombie, seen := l.Seen(i)
		if !seen || c.starts[k] == 0 || l.UIDs[i] < 0 {
			return Tree{}, false
		}
		if cid, ok := s.opt.Known[Key{PID: pid, StartTicks: c.starts[k], PGID: c.pgid}]; ok && cid != ids[0] {
			return Tree{}, false // ambiguous by the ledger: read it all
		}
		if zombie {
			continue
		}
		// The listing gives the real UID only: the others are unread (-1).
		id := fingerprint.Identity{Stat: fingerprint.Stat{PID: pid, Comm: comm, PPID: int(l.PPIDs[i]), PGID: c.pgid, StartTicks: c.starts[k]}, TGID: pid, UID: int(l.UIDs[i]), EUID: -1, SUID: -1}
		if k == lead && !byLedger {
			id.Stat, id.Argv = st, argv
		}
		switch {
		case t.UID == -2:
			t.UID = id.UID
		case t.UID != id.UID:
			t.UID = -1
		}
		t.Members = append(t.Members, id)
	}
	return t, true
}

// interesting is the cheap pre-check for groups without a live supervisor
// leader: does any member have a supervisor comm or a ledger identity?
func (s *scanner) interesting(pgid int, pids []int) bool {
	for _, pid := range pids {
		st, err := s.readStat(pid)
		if err != nil || st.PGID != pgid || st.Zombie() {
			continue
		}
		if s.supervisor(pid, st.Comm, nil) {
			return true
		}
		if _, ok := s.opt.Known[Key{PID: pid, StartTicks: st.StartTicks, PGID: pgid}]; ok {
			return true
		}
	}
	return false
}

// mayHoldOnly is Options.Only's filter: could this group hold a tree of
// one of the wanted containers? It errs towards yes: an unreadable argv
// keeps the group, and a known PID is enough (the full read then checks
// the whole identity). leaderArgv, when not nil, is leader's argv as
// just read.
func (s *scanner) mayHoldOnly(pids []int, leader int, leaderArgv []string) bool {
	for _, pid := range pids {
		if s.knownPIDs[pid] {
			return true
		}
		var argv []string
		var err error
		if pid == leader && leaderArgv != nil {
			argv = leaderArgv
		} else {
			argv, err = s.readArgv(pid)
		}
		if err != nil {
			if errors.Is(err, fingerprint.ErrNotFound) {
				continue
			}
			return true
		}
		for _, cid := range containerid.FromArgv(argv) {
			if s.opt.Only[cid] {
				return true
			}
		}
	}
	return false
}

// ledByAnother reports whether group c is led by a live supervisor
// whose argv names one container, not one of Only's, and Known ties
// none of its members to one of Only's (see Options.ByLeader). The
// leader is read as partial reads it: argv, then stat, which must show
// the process listed. It returns the leader's argv when it read it, for
// Only's filter not to read it again.
func (s *scanner) ledByAnother(c candidate) (argv []string, other bool) {
	for _, pid := range c.pids {
		if s.knownPIDs[pid] {
			return nil, false
		}
	}
	lead := slices.Index(c.pids, c.pgid)
	if lead < 0 {
		return nil, false
	}
	argv, err := s.readArgv(c.pgid)
	if err != nil {
		return nil, false
	}
	st, err := s.readStat(c.pgid)
	// A start the listing gave (the BPF task iterator's; 0: none) must
	// be the one read: the PID is the listed process's.
	if err != nil || st.PGID != c.pgid || st.Zombie() || len(c.starts) == len(c.pids) && c.starts[lead] != 0 && st.StartTicks != c.starts[lead] ||
		!s.supervisor(c.pgid, st.Comm, argv) {
		return argv, false
	}
	ids := containerid.FromArgv(argv)
	return argv, len(ids) == 1 && !s.opt.Only[ids[0]]
}

func (s *scanner) hasSupervisorOrKnown(t Tree) bool {
	for _, m := range t.Members {
		if s.supervisor(m.PID, m.Comm, m.Argv) {
			return true
		}
		if _, ok := s.opt.Known[Key{PID: m.PID, StartTicks: m.StartTicks, PGID: t.PGID}]; ok {
			return true
		}
	}
	return false
}

// supervisor reports whether a process is in the supervisor set. A
// process named kc-hook counts only as the `kc-hook supervise` wrapper:
// kc-hook's own stages run under that name too, and at poststop one can sit
// in a group whose other members carry the container ID (conmon's, with
// podman's cleanup in it). argv is read when not given, and only then.
func (s *scanner) supervisor(pid int, comm string, argv []string) bool {
	if !s.comms[comm] {
		return false
	}
	if comm != WrapperComm || slices.Contains(s.opt.Comms, WrapperComm) {
		return true
	}
	if argv == nil {
		var err error
		if argv, err = fingerprint.ReadArgv(s.opt.Root, pid); s.noteStalled(pid, err) != nil {
			return false
		}
	}
	return IsWrapperArgv(argv)
}

// IsWrapperArgv reports whether argv is a `kc-hook … supervise …`
// command line: "supervise" among the arguments before any "--".
func IsWrapperArgv(argv []string) bool {
	for _, a := range argv[min(1, len(argv)):] {
		if a == "--" {
			return false
		}
		if a == "supervise" {
			return true
		}
	}
	return false
}

func (t *Tree) addID(cid string) {
	if !slices.Contains(t.ContainerIDs, cid) {
		t.ContainerIDs = append(t.ContainerIDs, cid)
	}
}

func anyAnchor(ms []fingerprint.Identity) bool {
	for _, m := range ms {
		if len(containerid.FromArgv(m.Argv)) > 0 {
			return true
		}
	}
	return false
}

// Signalable reports whether the tree may ever be signalled on the grounds
// of its structure alone (liveness, age and ownership are the caller's).
func (t Tree) Signalable() bool {
	return !t.Ambiguous && !t.Foreign && t.ContainerID != "" && len(t.Members) > 0
}

// ages are the youngest and the oldest member's ages.
func ages(ms []fingerprint.Identity, uptime time.Duration) (youngest, oldest time.Duration) {
	if len(ms) == 0 {
		return 0, 0
	}
	newest, first := ms[0].StartTicks, ms[0].StartTicks
	for _, m := range ms[1:] {
		newest = max(newest, m.StartTicks)
		first = min(first, m.StartTicks)
	}
	age := func(ticks uint64) time.Duration { return max(uptime-ticksToDuration(ticks), 0) }
	return age(newest), age(first)
}

func ticksToDuration(t uint64) time.Duration {
	return time.Duration(t) * (time.Second / ClockTicks)
}

// readUptime returns the time since boot from root/uptime.
func readUptime(root string) (time.Duration, error) {
	data, err := os.ReadFile(root + "/uptime")
	if err != nil {
		return 0, fmt.Errorf("reading uptime: %w", err)
	}
	var secs float64
	if _, err := fmt.Sscanf(string(data), "%f", &secs); err != nil {
		return 0, fmt.Errorf("parsing uptime %q: %w", data, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// Stats returns the members' identities in the form pgkill revalidates.
func (t Tree) Stats() []fingerprint.Stat {
	out := make([]fingerprint.Stat, len(t.Members))
	for i, m := range t.Members {
		out[i] = m.Stat
	}
	return out
}

// PIDs returns the members' PIDs, in the form sockets.TreeSockets takes.
func (t Tree) PIDs() []int {
	out := make([]int, len(t.Members))
	for i, m := range t.Members {
		out[i] = m.PID
	}
	return out
}
