package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// leftCgroups picks, among the kc-watchman/<id> cgroups the scan listed,
// those of containers the ground truth says are gone and that no tree of
// this run keeps: a wrapper killed before its own teardown, where no
// ledger named its cgroup, leaves one, empty or holding what escaped the
// tree (DESIGN "Descendants that leave the group").
//
// Spared: a container in the answer, or one whose engine does not vouch
// for the cgroup's owner; one with a tree this run does not reap
// (contradicted, too young, ambiguous, foreign: its cgroup may hold it),
// or whose partial tree was gone before it could be read;
// a cgroup changed within MinAge; anything outside --container. A
// populated one is then checked for evidence of running like a stray
// tree (corroborateCgroups) and counted by the blast-radius guard.
func (sc *Scanned) leftCgroups(ts []Tree, live engine.Set) []contain.Listed {
	opt := sc.opt
	spare := map[string]bool{}
	for id := range sc.vanished {
		spare[id] = true
	}
	for _, t := range ts {
		switch t.Action {
		case action.WouldReap, action.Reaped, action.Gone:
		default:
			for _, id := range t.tree.ContainerIDs {
				spare[id] = true
			}
			spare[t.ContainerID] = true
		}
	}
	var out []contain.Listed
	for _, l := range sc.cgroups {
		id := l.ContainerID
		switch {
		case spare[id], live.IsLive(id), !live.Vouches(l.Record.UID),
			len(opt.Containers) > 0 && !opt.Containers[id],
			sc.scanned.Sub(l.Changed) < opt.MinAge:
			continue
		}
		spare[id] = true // listed on both hierarchies: one sweep
		out = append(out, l)
	}
	// Read for these only: most listed cgroups are live containers'.
	if err := contain.Populate(out); err != nil {
		sc.log.Warn("could not read whether kc-watchman's cgroups hold processes; taken as populated", "err", err)
	}
	return out
}

// corroborateCgroups drops the populated cgroups whose container local
// evidence says still runs, as corroborate does for stray trees, and
// returns the count of root's evidence against containers the engines do
// not list at all, for the wrong-store rule. An empty cgroup is kept:
// removing it kills nothing.
func (sc *Scanned) corroborateCgroups(ls []contain.Listed, live engine.Set) ([]contain.Listed, map[string]string) {
	var (
		ck   *corroborate.Checker
		kept []contain.Listed
		why  = map[string]string{}
	)
	for _, l := range ls {
		if !l.Populated {
			kept = append(kept, l)
			continue
		}
		if ck == nil {
			// A scoped scan that found no tree left its listing
			// unconfirmed (nothing to act on then): evidence needs it
			// whole.
			if sc.snap != nil && sc.snap.Pending() {
				confirm := sc.snap.Confirm
				if sc.confirm != nil {
					confirm = sc.confirm
				}
				if _, err := confirm(); err != nil {
					sc.log.Warn("cannot complete the process listing; populated cgroups left alone", "err", err)
					return kept, nil
				}
			}
			ck = sc.checker()
		}
		known := live.ListedFor(l.ContainerID, l.Record.UID)
		ev, running, err := ck.Check(corroborate.Query{ID: l.ContainerID, UID: l.Record.UID, Exited: known})
		var msg string
		switch {
		case running:
			msg = fmt.Sprintf("container %s is not listed as running by the engines but %s", l.ContainerID, ev)
			if ev.Root() && !known {
				why[l.ContainerID] = msg
			}
		case err != nil:
			msg = fmt.Sprintf("container %s: cannot look for evidence of it running: %v", l.ContainerID, err)
		default:
			kept = append(kept, l)
			continue
		}
		sc.log.Warn("ground truth contradicted; cgroup left alone", "container", l.ContainerID, "cgroup", l.Record.Path, "evidence", msg)
	}
	return kept, why
}

// populatedCount counts the cgroups a sweep would kill in, but those of
// containers whose init the kernel saw exit (as blastRadius does trees).
func populatedCount(opt Options, ls []contain.Listed) int {
	n := 0
	for _, l := range ls {
		if l.Populated && opt.InitExited[l.ContainerID] == 0 {
			n++
		}
	}
	return n
}

// sweepLeftCgroups sweeps the cgroups leftCgroups picked (a dry run
// reports them as would-reap), but those swept with their tree already.
// The sweep itself withholds every process the member rules refuse, and
// every one started after the scan or the container's death (bornBefore:
// the container restarted meanwhile, into the same cgroup).
func (sc *Scanned) sweepLeftCgroups(ctx context.Context, rep *Report, ls []contain.Listed, spare func(fingerprint.Stat) bool) {
	opt, log := sc.opt, sc.log
	swept := map[string]bool{}
	for _, c := range rep.Cgroups {
		swept[c.ContainerID] = true
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, 8) // a drain's cgroups, a few at a time
	)
	for _, l := range ls {
		id := l.ContainerID
		if swept[id] {
			continue
		}
		if !opt.Apply {
			lc := l.Record
			lc.Outcome = action.WouldReap
			rep.Cgroups = append(rep.Cgroups, Cgroup{ContainerID: id, Cgroup: lc})
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c := Cgroup{ContainerID: id, Cgroup: sweepListed(ctx, opt, log, l, sc.bornBefore(id), spare)}
			mu.Lock()
			rep.Cgroups = append(rep.Cgroups, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.SortFunc(rep.Cgroups, func(a, b Cgroup) int { return strings.Compare(a.ContainerID, b.ContainerID) })
}

func sweepListed(ctx context.Context, opt Options, log *slog.Logger, l contain.Listed, bornBefore uint64, spare func(fingerprint.Stat) bool) ledger.Cgroup {
	o := opt.Contain
	o.Systemd = nil // cgroupfs only: scopes are not listed
	cg, err := contain.FromRecord(l.Record, l.ContainerID, o)
	if err != nil {
		lc := l.Record
		lc.Outcome, lc.Error = action.SkipForeign, err.Error()
		return lc
	}
	defer cg.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res := contain.Sweep(ctx, cg, contain.SweepOptions{Root: opt.Root, BornBefore: bornBefore, Spare: spare})
	args := []any{"container", l.ContainerID, "cgroup", cg.String(), "action", res.Outcome, "method", res.Method,
		"killed", len(res.Killed), "withheld", len(res.Withheld), "removed", res.Removed, "err", res.Err}
	switch {
	case res.Outcome == action.WouldNotDie:
		log.Error("[REAP] cgroup of a gone container", args...)
	case len(res.Killed) > 0:
		log.Warn("[REAP] cgroup of a gone container: processes outlived their tree", args...)
	default:
		log.Info("[REAP] cgroup of a gone container", args...)
	}
	return res.Record(cg)
}

// bootTicks is now in the clock /proc/<pid>/stat's start times count in
// (CLOCK_BOOTTIME, in clock ticks); 0 when it cannot be read, which
// withholds nothing by age.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return uint64(time.Duration(ts.Nano()) / (time.Second / trees.ClockTicks))
}

// bornBefore is the start tick (in /proc's clock) a process in container
// id's cgroup must have started before for this run's sweeps to judge it:
// the scan's end and, for a death, the death's. A death's engines are
// asked while the host is scanned, so an answer can predate a restart
// into the same cgroup; what started after the death is the restarted
// container's, as its trees are (bornAfter). A tick early: one started
// in the death's tick is withheld too.
func (sc *Scanned) bornBefore(id string) uint64 {
	died := sc.opt.diedAt(id)
	if sc.bootTicks == 0 {
		if !died.IsZero() {
			return 1 // the death cannot be placed: all is withheld
		}
		return 0 // unknown: nothing is withheld by age
	}
	if died.IsZero() {
		return sc.bootTicks
	}
	return min(sc.bootTicks, sc.tickBefore(died))
}

// spared is what this run's cgroup sweeps withhold: the processes of every
// tree the scan found that the run does not reap (live, young, ambiguous,
// foreign, outside --container, or left partial). A live container's
// group can hold a process of a gone one's — a member that carries its ID,
// in its cgroup — and the member rules, which look at that process alone,
// cannot tell it from the gone container's own; a scan that judged the
// group on its leader never learnt of it.
func (sc *Scanned) spared(ts []Tree) func(fingerprint.Stat) bool {
	reaped := map[int]bool{}
	for _, t := range ts {
		switch t.Action {
		case action.WouldReap, action.Reaped, action.Gone:
			reaped[t.PGID] = true
		}
	}
	type key struct {
		pid   int
		start uint64
	}
	keep := map[key]bool{}
	for _, t := range sc.found {
		if reaped[t.PGID] {
			continue
		}
		for _, m := range append(slices.Clip(t.Members), t.Escaped...) {
			keep[key{m.PID, m.StartTicks}] = true
		}
	}
	if len(keep) == 0 {
		return nil
	}
	return func(st fingerprint.Stat) bool { return keep[key{st.PID, st.StartTicks}] }
}
