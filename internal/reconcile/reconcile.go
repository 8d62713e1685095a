// Package reconcile compares the supervisor trees on the host with
// podman's list of live containers and reaps the strays (DESIGN "Identity rules", "Killing safely", "The outside", "Ledger").
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/reap"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// Options configure a run.
type Options struct {
	// Root is the procfs mount; default /proc.
	Root  string
	Comms []string
	// MinAge: trees younger than this are left alone (they may be racing
	// their container's registration). Zero disables the check; the CLI
	// default is 90s.
	MinAge    time.Duration
	KillGrace time.Duration
	Apply     bool
	// FullScan reads every process (reports foreign groups too).
	FullScan bool
	// MaxReap is the blast-radius guard (DESIGN "One view of the host"): an apply run that
	// finds more strays than this, or (unscoped, from guardMinStrays on)
	// more than half of all trees, reaps none. Zero disables it.
	MaxReap int
	// Lister is how the fast scan lists processes.
	Lister proctable.Lister
	// Program, when set, is the loaded iterator program the scan lists
	// with (watch loads it once for all its decisions).
	Program *taskiter.Program
	// Containers, when not empty, limits the run to trees of these
	// container IDs.
	Containers map[string]bool
	// DiedAt, when set, is when the container(s) in Containers died (a
	// death event): a tree whose members all started after it is a
	// restarted container's, not the dead one's, and is left alone
	// (skipped-young) whatever the engines answer; its cgroup's sweep
	// withholds what started from the tick before it (bornBefore).
	DiedAt time.Time
	// DiedAtByID is DiedAt for each container of a burst of deaths
	// decided together; it wins over DiedAt for the containers it names.
	DiedAtByID map[string]time.Time
	// InitExited maps the containers whose init the kernel reported
	// exited (a pinned pidfd became readable) to that init's host PID.
	// Their trees do not count toward --max-reap: the guard is against a
	// wrong engine answer at scale, and these deaths are not the
	// engine's word (a node drain must not be refused round after round).
	// And an engine that still calls such a container live, naming that
	// very init, is behind the kernel (see staleLive).
	InitExited map[string]int
	// Store is the ledger; nil runs without one (no attribution of trees
	// whose anchor died, no snapshots, no garbage collection).
	Store *ledger.Store
	// LedgerRetention is how long a dry run keeps the record of a
	// container that is gone and whose processes are all dead, since the
	// record was last written (0: DefaultLedgerRetention; negative: a
	// dry run collects nothing). An apply run collects such records at
	// once (after MinAge).
	LedgerRetention time.Duration
	// Look changes nothing, the ledger included: no snapshot is written
	// (doctor without --fix).
	Look bool
	// Contain finds the supervisors' cgroups the ledger names, to sweep
	// them with their trees (and, with a systemd client, stop scopes).
	Contain contain.Options
	Logger  *slog.Logger
}

// DefaultLedgerRetention: under the audit default no run applies, and the
// records of every container that ever ran would pile up, each read by
// every run. A week keeps a dead container's record for the operator
// looking back at last week's audit lines.
const DefaultLedgerRetention = 7 * 24 * time.Hour

// Member is one process of a reported tree.
type Member struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Comm       string `json:"comm"`
	// Escaped: a descendant outside the tree's process group, a member
	// all the same (DESIGN "Descendants that leave the group"). Always
	// present: the seed design lists it among a member's fields.
	Escaped bool `json:"escaped"`
}

// MembersOf lists t's members for the reports: the group's, then the
// escaped descendants.
func MembersOf(t trees.Tree) []Member {
	out := make([]Member, 0, len(t.Members)+len(t.Escaped))
	for _, m := range t.Members {
		out = append(out, Member{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm})
	}
	for _, m := range t.Escaped {
		out = append(out, Member{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm, Escaped: true})
	}
	return out
}

// WithheldOf lists the descendants of t reported and never signalled.
func WithheldOf(t trees.Tree) []Member {
	var out []Member
	for _, m := range t.Withheld {
		out = append(out, Member{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm})
	}
	return out
}

// Tree is one line of the report.
type Tree struct {
	ContainerID string `json:"container_id"`
	// Pod is namespace/pod/container where an engine named it (the
	// kubelet's labels).
	Pod        string   `json:"pod,omitempty"`
	PGID       int      `json:"pgid"`
	UID        int      `json:"uid"`
	AgeSeconds int64    `json:"age_seconds"`
	Members    []Member `json:"members"`
	// Withheld are descendants outside the group of another UID (or
	// setuid) or carrying another container's ID: reported, never
	// signalled.
	Withheld []Member      `json:"withheld,omitempty"`
	Action   action.Action `json:"action"`
	Error    *string       `json:"error"`

	tree trees.Tree
}

// Cgroup is a container's supervisor cgroup after its sweep.
type Cgroup struct {
	ContainerID string `json:"container_id"`
	ledger.Cgroup
}

// Report is the outcome of a run, printed as JSON with --format json.
type Report struct {
	LivenessKnown bool   `json:"liveness_known"`
	Source        string `json:"source"`
	DryRun        bool   `json:"dry_run"`
	Trees         []Tree `json:"trees"`
	// Cgroups are the supervisors' cgroups swept with their containers'
	// trees, and those of gone containers nothing else swept (a dry run
	// lists these as would-reap).
	Cgroups []Cgroup `json:"cgroups,omitempty"`
	// LedgerCollected counts ledger records garbage-collected (apply only).
	LedgerCollected int `json:"ledger_collected"`
	// Unrecorded is why a reap's outcome could not be written to the
	// ledger: the audit trail of a kill is missing, so the run fails.
	// UnrecordedText says it in the JSON.
	Unrecorded     error  `json:"-"`
	UnrecordedText string `json:"unrecorded,omitempty"`
	// Refused says why an apply run reaped nothing although it found
	// strays (the blast-radius guard).
	Refused string `json:"refused,omitempty"`
	// WouldRefuse, in a dry run, says why an apply run with the same
	// findings would reap nothing (the blast-radius guard), so that an
	// audit shows it before --apply is switched on.
	WouldRefuse string `json:"would_refuse,omitempty"`
}

// Failed reports whether a tree would not die, a reap went unrecorded or
// the blast-radius guard refused the run.
func (r Report) Failed() bool {
	if r.Unrecorded != nil || r.Refused != "" {
		return true
	}
	for _, t := range r.Trees {
		if t.Action == action.WouldNotDie {
			return true
		}
	}
	for _, c := range r.Cgroups {
		if c.Outcome == action.WouldNotDie {
			return true
		}
	}
	return false
}

// Count counts the trees with the given action.
func (r Report) Count(a action.Action) int {
	n := 0
	for _, t := range r.Trees {
		if t.Action == a {
			n++
		}
	}
	return n
}

// Decide is the decision table for one tree. It is pure: the caller has
// already established liveness.
func Decide(t trees.Tree, live engine.Set, minAge time.Duration) action.Action {
	switch {
	case t.Ambiguous:
		return action.SkipAmbiguous
	case t.Foreign:
		return action.SkipForeign
	case live.IsLive(t.ContainerID):
		return action.SkipLive
	case !live.Vouches(t.UID):
		return action.SkipOtherUID
	case !t.AgeKnown:
		return action.SkipAgeUnknown
	case t.Age < minAge:
		return action.SkipYoung
	}
	return action.WouldReap
}

// diedAt is when container id died, for a run deciding on deaths (zero
// otherwise): a tree's decision and its cgroup's sweep judge by the same.
func (o Options) diedAt(id string) time.Time {
	if at, ok := o.DiedAtByID[id]; ok {
		return at
	}
	return o.DiedAt
}

// bornAfter says whether every member of t started after the death at
// died, in /proc's start ticks (see tickBefore): one started in the
// death's own tick counts as after it, so the doubt falls on sparing.
// The death is placed from the scan's end, not from now: the engines'
// answer came between, and a slow one (a second under load) made a tree
// started a moment before the death look born after it, and spared.
func (sc *Scanned) bornAfter(t trees.Tree, died time.Time) bool {
	if died.IsZero() || !t.AgeKnown || len(t.Members) == 0 {
		return false
	}
	if sc.bootTicks == 0 {
		// The boot clock unread: by the ages, as of the scan's end.
		return t.Oldest < sc.scanned.Sub(died)
	}
	first := t.Members[0].StartTicks
	for _, m := range t.Members[1:] {
		first = min(first, m.StartTicks)
	}
	return first >= sc.tickBefore(died)
}

// tickBefore is the tick, in /proc's start ticks, a tick before the one
// at died, placed from the scan's end (sc.scanned, sc.bootTicks); at
// least 1.
func (sc *Scanned) tickBefore(died time.Time) uint64 {
	tick := time.Second / trees.ClockTicks
	ago := uint64((max(sc.scanned.Sub(died), 0)+tick-1)/tick) + 1
	if ago >= sc.bootTicks {
		return 1
	}
	return sc.bootTicks - ago
}

// Scanned is a scan of the host's supervisor trees. The engines may be
// asked which containers are alive while it is taken; an answer that
// leaves anything to act on is asked after it (Doubted), but on deaths
// alone, whose own rule spares what was born after them.
type Scanned struct {
	opt     Options
	log     *slog.Logger
	records []*ledger.Record
	found   []trees.Tree
	// snap is the process table the scan decided from, which the rest of
	// the run reads (DESIGN "One view of the host"); nil after a full scan.
	snap *proctable.Listing
	// scanned is when the scan ended: the trees' ages are as of then.
	scanned time.Time
	// cgroups are kc-watchman's cgroups on cgroupfs, listed with the scan
	// (and judged, as the trees are, by an answer asked after it).
	cgroups []contain.Listed
	// bootTicks is the scan's end in /proc's start ticks.
	bootTicks uint64
	// ck is the run's evidence checker (see checker).
	ck *corroborate.Checker
	// vanished are the containers of partial trees gone before they
	// could be read in full (see complete).
	vanished map[string]bool
	// confirm completes snap; nil: snap.Confirm (tests make it fail).
	confirm func() (int, error)
}

// Scan reads the ledger and scans /proc. It changes nothing. Acting only
// on an answer asked after the scan closes a race (the engines may be
// asked while it runs, but an answer that leaves anything to act on is
// asked again, Doubted; deaths have their own rule, bornAfter): a container created after the answer has its
// trees, if any, only in a later scan, so a tree found here is either in
// the answer or really without a live container.
func Scan(opt Options) (*Scanned, error) {
	if opt.KillGrace <= 0 {
		opt.KillGrace = pgkill.DefaultGrace
	}
	if opt.Root == "" {
		opt.Root = fingerprint.DefaultRoot
	}
	if opt.Contain.Mounts == nil {
		// One read of the cgroup mounts for the run's listing, sweeps
		// and reaps.
		opt.Contain.Mounts = contain.NewMountTable()
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sc := &Scanned{opt: opt, log: log}
	var known map[trees.Key]string
	if opt.Store != nil {
		var errs []error
		sc.records, errs = opt.Store.List()
		for _, err := range errs {
			log.Warn("unreadable ledger record", "err", err)
		}
		known = ledger.KnownFrom(sc.records, opt.Store.CurrentBootID())
	}
	found, stats, snap, err := trees.ScanSnapshot(trees.Options{Root: opt.Root, Comms: opt.Comms, Known: known, Full: opt.FullScan, Lister: opt.Lister, Program: opt.Program,
		LayoutCache: ledger.LayoutCache(opt.Store), Watch: corroborate.Watch, Only: opt.Containers, Partial: true})
	// The ticks first: read a moment early, they withhold and spare more.
	sc.bootTicks = bootTicks()
	sc.scanned = time.Now()
	if err != nil {
		return nil, fmt.Errorf("scanning processes: %w", err)
	}
	sc.snap = snap
	if len(stats.Stalled) > 0 {
		log.Warn("argv of some processes not read: their memory did not answer in time (a thread of theirs can hold it for a user's FUSE server); their groups are of unknown age, not acted on this run", "pids", stats.StalledNote())
	}
	if sc.cgroups, err = contain.List(opt.Contain); err != nil {
		log.Warn("could not list kc-watchman's cgroups", "err", err)
	}
	log.Debug("scanned", "processes", stats.Processes, "groups", stats.Groups, "trees", len(found), "lister", stats.Lister, "lister_fallback", stats.ListerFallback, "duration", stats.Duration)
	sc.found = found
	return sc, nil
}

// Doubted returns, sorted, the containers live (asked while the scan
// ran) leaves the run something to act on for: those of trees in scope
// it does not call live, and of kc-watchman cgroups. Such an answer may
// predate what the scan read (a container created meanwhile, an argv
// exec'd to name it), so the caller asks again about them, the scan
// over, and decides with that answer; one that leaves none is taken as
// it is (the scan's trees are spared whatever came after it).
func (sc *Scanned) Doubted(live engine.Set) []string {
	// As Run will see it: a kernel-reported death makes a container gone.
	live = staleLive(sc.opt, slog.New(slog.DiscardHandler), live)
	inScope := func(id string) bool { return len(sc.opt.Containers) == 0 || sc.opt.Containers[id] }
	var ids []string
	for _, t := range sc.found {
		for _, id := range t.ContainerIDs {
			if inScope(id) && !live.IsLive(id) {
				ids = append(ids, id)
			}
		}
	}
	for _, l := range sc.cgroups {
		if inScope(l.ContainerID) && !live.IsLive(l.ContainerID) {
			ids = append(ids, l.ContainerID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// UseStore gives a scan taken without a ledger one to record outcomes in
// (an apply run creates the state dir only once podman has answered).
func (sc *Scanned) UseStore(s *ledger.Store) {
	if sc.opt.Store == nil {
		sc.opt.Store = s
	}
}

// Run decides on the scanned trees with podman's answer and, with Apply,
// reaps the strays.
func (sc *Scanned) Run(ctx context.Context, live engine.Set) (Report, error) {
	opt, log, records := sc.opt, sc.log, sc.records
	live = staleLive(opt, log, live)
	found := sc.complete(live)
	rep := Report{LivenessKnown: true, Source: string(live.Source), DryRun: !opt.Apply, Trees: []Tree{}}

	for _, t := range found {
		if t.HoldsCaller() {
			continue // never our own group, whatever it looks like
		}
		if len(opt.Containers) > 0 && !anyIn(t.ContainerIDs, opt.Containers) {
			continue
		}
		rt := Tree{ContainerID: t.ContainerID, Pod: live.Pods[t.ContainerID], PGID: t.PGID, UID: t.UID, Action: Decide(t, live, opt.MinAge), tree: t}
		if rt.Action == action.WouldReap && sc.bornAfter(t, opt.diedAt(t.ContainerID)) {
			rt.Action = action.SkipYoung
		}
		if t.AgeKnown {
			rt.AgeSeconds = int64(t.Age / time.Second)
		} else {
			rt.AgeSeconds = -1
		}
		rt.Members, rt.Withheld = MembersOf(t), WithheldOf(t)
		rep.Trees = append(rep.Trees, rt)
	}

	// Before anything is touched: a stray whose container still runs here
	// is a contradiction; more than one means the answer is the wrong one.
	// The cgroups of gone containers count as their trees do.
	why := sc.corroborate(rep.Trees, live)
	left, whyc := sc.corroborateCgroups(sc.leftCgroups(rep.Trees, live), live)
	if err := wrongStore(why, whyc); err != nil {
		// The answer is the wrong one for every tree, not only for the
		// contradicted: none would be reaped by it.
		rep.LivenessKnown, rep.Source = false, ""
		for i := range rep.Trees {
			if rep.Trees[i].Action == action.WouldReap {
				rep.Trees[i].Action = action.SkipContradicted
			}
		}
		return rep, err
	}

	if !opt.Look {
		refreshSnapshots(opt, log, rep.Trees, records)
	}
	spare := sc.spared(rep.Trees)
	if opt.Apply {
		rep.Trees = dropDead(opt, rep.Trees)
		if why := blastRadius(opt, rep.Trees, populatedCount(opt, left), live); why != "" {
			// A wrong answer at scale looks exactly like this: reap
			// nothing, collect nothing, and say so.
			rep.Refused = why
			log.Error("blast-radius guard: nothing reaped", "why", why)
			return rep, nil
		}
		rep.Cgroups, rep.Unrecorded = reapStrays(ctx, opt, log, rep.Trees, sc.bornBefore, sc.vanished, spare)
		if rep.Unrecorded != nil {
			rep.UnrecordedText = rep.Unrecorded.Error()
		}
	} else if why := blastRadius(opt, rep.Trees, populatedCount(opt, left), live); why != "" {
		rep.WouldRefuse = why
		log.Warn("an --apply run would reap nothing (blast-radius guard)", "why", why)
	}
	sc.sweepLeftCgroups(ctx, &rep, left, spare)
	rep.Trees = append(rep.Trees, survivors(opt, records, live, rep.Trees)...)
	if opt.Apply {
		rep.LedgerCollected = collect(opt, log, records, live, contradicted(rep.Trees), opt.MinAge)
	} else if opt.LedgerRetention >= 0 {
		// Only files in the ledger go; nothing is signalled.
		keep := opt.LedgerRetention
		if keep == 0 {
			keep = DefaultLedgerRetention
		}
		rep.LedgerCollected = collect(opt, log, records, live, contradicted(rep.Trees), keep)
	}
	return rep, nil
}

// survivors are the members that left their tree's group (escaped) of a
// gone container's tree an earlier run recorded as would-not-die, still
// alive: no scan finds them again (a group led by a live process that
// is no supervisor is never one to signal), so each is reported, as
// would-not-die, and not signalled. The run then fails, as the one that
// could not kill them did.
func survivors(opt Options, records []*ledger.Record, live engine.Set, found []Tree) []Tree {
	seen := map[int]bool{}
	for _, t := range found {
		for _, m := range t.Members {
			seen[m.PID] = true
		}
	}
	var out []Tree
	for _, r := range records {
		if live.IsLive(r.ContainerID) || (len(opt.Containers) > 0 && !opt.Containers[r.ContainerID]) || (opt.Store != nil && !opt.Store.Current(r)) {
			continue
		}
		for _, t := range r.Trees {
			// Of a UID the answer is ground truth for, as any stray.
			if t.Action != action.WouldNotDie || !live.Vouches(t.UID) {
				continue
			}
			for _, m := range t.Members {
				if !m.Escaped || seen[m.PID] {
					continue
				}
				st, err := fingerprint.Revalidate(cmp.Or(opt.Root, fingerprint.DefaultRoot), fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks})
				if err != nil || st.Zombie() {
					continue
				}
				seen[m.PID] = true
				why := "left the group of a tree that would not die, and still lives: not signalled again (a group led by a live process that is no supervisor is never signalled); see to it by hand"
				out = append(out, Tree{ContainerID: r.ContainerID, PGID: st.PGID, UID: t.UID, AgeSeconds: -1, Action: action.WouldNotDie, Error: &why,
					Members: []Member{{PID: m.PID, StartTicks: m.StartTicks, Comm: st.Comm, Escaped: true}}})
			}
		}
	}
	return out
}

// complete reads in full the trees the scan left partial whose
// container the answer does not call live: a live container's tree is
// spared as its leader (argv or ledger) and the listing show it, and only the
// others are decided on every member's files (DESIGN "One view of the
// host"). The completion reads the members the scan listed; a group it
// finds another container's is left for the next run (an exec since the
// scan may name a container newer than the answer).
//
// A live container's partial trees are read in full too when its ledger
// snapshot would change: a snapshot gives its members to the container
// for later runs, so it is taken only of what a full read shows — a
// member carrying another container's ID makes the group ambiguous, and
// no container's to record. A tree gone by then keeps its container's
// cgroup unswept this run (sc.vanished), as its decision would have.
func (sc *Scanned) complete(live engine.Set) []trees.Tree {
	changed := sc.changedSnapshots(live)
	var todo []int
	for i, t := range sc.found {
		if t.Partial && (!live.IsLive(t.ContainerID) || changed[t.ContainerID]) {
			todo = append(todo, i)
		}
	}
	full, ok, stalled := completeAll(sc.found, todo)
	out := make([]trees.Tree, 0, len(sc.found))
	for i, t := range full {
		was := sc.found[i]
		// A full read that gives the group to another container alone
		// read an argv exec'd since the scan, maybe to name a container
		// newer than the answer: the group waits for a run that scans it
		// so (an ambiguous one is reported as such).
		moved := ok[i] && was.Partial && !t.Ambiguous && t.ContainerID != was.ContainerID
		if ok[i] && !moved {
			out = append(out, t)
			continue
		}
		for _, id := range append(slices.Clone(was.ContainerIDs), t.ContainerIDs...) {
			if len(sc.opt.Containers) == 0 || sc.opt.Containers[id] {
				if sc.vanished == nil {
					sc.vanished = map[string]bool{}
				}
				sc.vanished[id] = true
			}
		}
	}
	if len(stalled) > 0 {
		sc.log.Warn("argv of some members not read: their memory did not answer in time; their trees are of unknown age, not acted on this run", "pids", trees.Stats{Stalled: stalled}.StalledNote())
	}
	return out
}

// completeAll reads found's trees at todo in full, a few at a time (each
// is a few files per member, and a host of many strays has many). It
// returns found with those replaced, whether each is still a tree (a
// group read in full may be no tree any more), and the PIDs whose memory
// did not answer. A reader's panic is the caller's again, as it was when
// the trees were read in turn.
func completeAll(found []trees.Tree, todo []int) ([]trees.Tree, []bool, []int) {
	out := slices.Clone(found)
	ok := make([]bool, len(found))
	for i := range ok {
		ok[i] = true
	}
	next := make(chan int, len(todo))
	for _, i := range todo {
		next <- i
	}
	close(next)
	var (
		mu       sync.Mutex
		stalled  []int
		panicked any
		wg       sync.WaitGroup
	)
	for range min(len(todo), runtime.GOMAXPROCS(0), 4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A Completer is one goroutine's: it holds its own /proc
			// reader.
			var cp trees.Completer
			defer cp.Close()
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				if r := recover(); r != nil && panicked == nil {
					panicked = r
				}
				stalled = append(stalled, cp.Stalled()...)
			}()
			for i := range next {
				out[i], ok[i] = cp.Complete(found[i])
			}
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
	slices.Sort(stalled)
	return out, ok, slices.Compact(stalled)
}

// changedSnapshots are the live containers whose trees, as scanned, are
// not those their ledger record holds (refreshSnapshots would write
// them).
func (sc *Scanned) changedSnapshots(live engine.Set) map[string]bool {
	if sc.opt.Store == nil {
		return nil
	}
	now := time.Now()
	byContainer := map[string][]ledger.Tree{}
	for _, t := range sc.found {
		if !t.Signalable() || !live.IsLive(t.ContainerID) || t.HoldsCaller() ||
			(len(sc.opt.Containers) > 0 && !anyIn(t.ContainerIDs, sc.opt.Containers)) {
			continue
		}
		byContainer[t.ContainerID] = append(byContainer[t.ContainerID], ledger.Snapshot(t, "reconcile", now))
	}
	held := map[string][]ledger.Tree{}
	for _, r := range sc.records {
		if r != nil {
			held[r.ContainerID] = r.Trees
		}
	}
	changed := map[string]bool{}
	for id, snaps := range byContainer {
		if !sameTrees(held[id], snaps) {
			changed[id] = true
		}
	}
	return changed
}

// dropDead leaves out the strays none of whose members is still the
// scanned process and whose group is empty: another run reaped them
// between this run's scan and its turn at the apply lock, or they exited.
// Reporting them again would count one reap twice. A group that still has
// processes goes on to the kill, which looks for what joined it since the
// scan (a kernel's worker outliving the members recorded).
func dropDead(opt Options, ts []Tree) []Tree {
	root := opt.Root
	if root == "" {
		root = "/proc"
	}
	out := ts[:0]
	for _, t := range ts {
		if t.Action == action.WouldReap && !anyMemberAlive(root, t.Members) && pgkill.GroupEmpty(t.PGID) {
			continue
		}
		out = append(out, t)
	}
	return out
}

func anyMemberAlive(root string, ms []Member) bool {
	for _, m := range ms {
		if fingerprint.Alive(root, fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks}) {
			return true
		}
	}
	return false
}

// guardMinStrays is the least number of strays at which the "more than
// half of all trees" rule applies: one stray among two trees is a host's
// ordinary day.
const guardMinStrays = 3

// blastRadius says why an apply run with these decisions must not reap,
// or "" when it may. A run scoped with --container is judged by MaxReap
// alone: every tree of a gone container is stray by definition. "All
// trees" are those of the UIDs the answer vouches for: anyone can start
// groups named kcserver, which would otherwise pad the count.
func blastRadius(opt Options, ts []Tree, cgroups int, live engine.Set) string {
	if opt.MaxReap <= 0 {
		return ""
	}
	n, exited, all := 0, 0, 0
	if cgroups > opt.MaxReap {
		return fmt.Sprintf("%d populated cgroups of gone containers found, more than --max-reap %d: if their containers are all truly gone, raise --max-reap (KC_MAX_REAP) for one run", cgroups, opt.MaxReap)
	}
	for _, t := range ts {
		if live.Vouches(t.UID) {
			all++
		}
		switch {
		case t.Action != action.WouldReap:
		case opt.InitExited[t.ContainerID] > 0:
			exited++
		default:
			n++
		}
	}
	switch {
	case n > opt.MaxReap:
		return fmt.Sprintf("%d stray trees found, more than --max-reap %d: if they are all truly stray, raise --max-reap (KC_MAX_REAP) for one run", n, opt.MaxReap)
	case len(opt.Containers) == 0 && n >= guardMinStrays && 2*n > all-exited:
		return fmt.Sprintf("%d of %d trees found stray, more than half: check that the engines asked are this host's (--engine, --containerd-namespace), or reap with --container", n, all)
	}
	return ""
}

// refreshSnapshots records each live container's trees so that a later run
// can still attribute them after their anchor dies (DESIGN "Ledger"). Dry runs
// do this too: it changes nothing but the ledger. A record read by the
// scan (records) that already holds the same trees is left as it is: on
// a host whose containers do not change, every run would otherwise
// rewrite every live container's record.
func refreshSnapshots(opt Options, log *slog.Logger, ts []Tree, records []*ledger.Record) {
	if opt.Store == nil {
		return
	}
	now := time.Now()
	byContainer := map[string][]ledger.Tree{}
	for _, t := range ts {
		if t.Action == action.SkipLive && t.ContainerID != "" {
			byContainer[t.ContainerID] = append(byContainer[t.ContainerID], ledger.Snapshot(t.tree, "reconcile", now))
		}
	}
	for _, r := range records {
		if r != nil && sameTrees(r.Trees, byContainer[r.ContainerID]) {
			delete(byContainer, r.ContainerID)
		}
	}
	for id, snaps := range byContainer {
		err := opt.Store.Update(id, func(r *ledger.Record) error {
			r.Trees = snaps
			return nil
		})
		if err != nil {
			log.Warn("could not refresh ledger snapshot", "container", id, "err", err)
		}
	}
}

// sameTrees reports whether two snapshots hold the same trees (group,
// UID, source, members by identity and comm), whenever they were seen.
func sameTrees(a, b []ledger.Tree) bool {
	return len(a) > 0 && slices.EqualFunc(a, b, func(x, y ledger.Tree) bool {
		return x.PGID == y.PGID && x.UID == y.UID && x.Source == y.Source && slices.Equal(x.Members, y.Members)
	})
}

// reapStrays hands the strays to reap, one call per container (each
// reaps its trees concurrently, and the containers run concurrently too),
// and copies what became of them into the report. It returns the
// containers' swept cgroups, and why an outcome could not be recorded,
// if one could not.
func reapStrays(ctx context.Context, opt Options, log *slog.Logger, ts []Tree, bornBefore func(id string) uint64, keep map[string]bool, spare func(fingerprint.Stat) bool) ([]Cgroup, error) {
	byContainer := map[string][]int{}
	spared := maps.Clone(keep) // a tree of it is left: its cgroup may hold it
	if spared == nil {
		spared = map[string]bool{}
	}
	for i := range ts {
		if ts[i].Action == action.WouldReap {
			byContainer[ts[i].ContainerID] = append(byContainer[ts[i].ContainerID], i)
			continue
		}
		for _, id := range ts[i].tree.ContainerIDs {
			spared[id] = true
		}
		spared[ts[i].ContainerID] = true
	}
	shared := sockets.NewShared()
	defer shared.Close()
	ropt := reap.Options{Root: opt.Root, Grace: opt.KillGrace, Store: opt.Store, Source: "reconcile", Contain: opt.Contain, Logger: log, Spare: spare, Sockets: shared}
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		unrecorded []error
		cgroups    []Cgroup
	)
	for id, idx := range byContainer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := reap.Container{ID: id, Pod: ts[idx[0]].Pod, KeepCgroup: spared[id]}
			for _, i := range idx {
				// The janitor reads /proc in host terms.
				c.Trees = append(c.Trees, reap.Tree{Tree: ts[i].tree, HostUID: ts[i].tree.UID})
			}
			ropt := ropt
			ropt.BornBefore = bornBefore(id)
			res := reap.Run(ctx, ropt, c)
			mu.Lock()
			if res.Unrecorded != nil {
				unrecorded = append(unrecorded, fmt.Errorf("container %s: %w", id, res.Unrecorded))
			}
			if res.Cgroup != nil {
				cgroups = append(cgroups, Cgroup{ContainerID: id, Cgroup: *res.Cgroup})
			}
			mu.Unlock()
			for k, i := range idx {
				ts[i].Action = res.Trees[k].Action
				if msg := res.Trees[k].Error; msg != "" {
					ts[i].Error = &msg
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(cgroups, func(a, b Cgroup) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return cgroups, errors.Join(unrecorded...)
}

// cgroupLeft: the record names the supervisor's cgroup, not swept away
// yet and still there. The record is all that says whose it is.
func cgroupLeft(opt Options, r *ledger.Record) bool {
	if r.Cgroup == nil || r.Cgroup.Removed {
		return false
	}
	o := opt.Contain
	o.Systemd = nil // only looked at, never stopped
	cg, err := contain.FromRecord(*r.Cgroup, r.ContainerID, o)
	if err != nil {
		return false
	}
	defer cg.Close()
	return cg.Exists()
}

// collect removes ledger records that can no longer matter: from another
// boot, or of a container that is not live and whose recorded init and
// trees are all dead. Records touched within keep are kept (at least
// MinAge, so a container being created right now is never forgotten; a
// dry run's retention); so are those of
// containers local evidence says still run (skip): the engine's silence
// about them is what was contradicted, and their record is the evidence
// the next run needs.
func collect(opt Options, log *slog.Logger, records []*ledger.Record, live engine.Set, skip map[string]bool, keep time.Duration) int {
	if opt.Store == nil {
		return 0
	}
	// young: kept for its age alone, whatever else is true of it.
	young := func(r *ledger.Record) bool {
		return time.Since(r.UpdatedAt) < max(keep, opt.MinAge) && (!opt.Apply || opt.Store.Current(r))
	}
	n := 0
	for _, r := range records {
		if live.IsLive(r.ContainerID) || skip[r.ContainerID] || (len(opt.Containers) > 0 && !opt.Containers[r.ContainerID]) {
			continue
		}
		// Kept as read by the scan is kept under the lock too (a record
		// is only ever touched later), so it is not locked and read
		// again: weeks of dry runs would pay three opens, and a hook's
		// hold on the lock, for every container of the retention, each
		// run.
		if young(r) {
			continue
		}
		removed, err := opt.Store.Remove(r.ContainerID, func(cur *ledger.Record) bool {
			if young(cur) {
				return true
			}
			if !opt.Store.Current(cur) {
				return false
			}
			return anyAlive(opt.Root, cur) || cgroupLeft(opt, cur)
		})
		if err != nil {
			lvl := slog.LevelWarn
			if !opt.Apply {
				lvl = slog.LevelDebug // a dry run by a user who may only read the ledger
			}
			log.Log(context.Background(), lvl, "could not collect ledger record", "container", r.ContainerID, "err", err)
		}
		if removed {
			n++
		}
	}
	opt.Store.RemoveStaleTemps(time.Hour)
	return n
}

func anyAlive(root string, r *ledger.Record) bool {
	for _, p := range []*ledger.Process{r.Supervisor, r.Init} {
		if p != nil && fingerprint.Alive(root, fingerprint.Stat{PID: p.PID, StartTicks: p.StartTicks}) {
			return true
		}
	}
	for _, t := range r.Trees {
		for _, m := range t.Members {
			if fingerprint.Alive(root, fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks}) {
				return true
			}
		}
	}
	return false
}

// contradicted is the set of containers whose trees were spared because
// local evidence says they still run.
func contradicted(ts []Tree) map[string]bool {
	out := map[string]bool{}
	for _, t := range ts {
		if t.Action == action.SkipContradicted && t.ContainerID != "" {
			out[t.ContainerID] = true
		}
	}
	return out
}

func anyIn(ids []string, set map[string]bool) bool {
	for _, id := range ids {
		if set[id] {
			return true
		}
	}
	return false
}
