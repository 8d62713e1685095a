package reconcile

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// sweepLeftCgroups sweeps the kc-watchman/<id> cgroups the scan listed
// whose container the ground truth says is gone, and which no ledger
// record brought to this run's reap: a wrapper killed before its own
// teardown, where no ledger named its cgroup, leaves one, empty or
// holding what escaped the tree (DESIGN "Descendants that leave the
// group"). A dry run reports them as would-reap.
//
// Spared: a container in the answer, or one whose engine does not vouch
// for the cgroup's owner; one local evidence says runs; one with a tree
// this run did not reap (too young, ambiguous, foreign: its cgroup may
// hold it); a cgroup changed within MinAge; anything outside
// --container. The sweep itself withholds every process the member
// rules refuse, and every one started after the scan (the container
// restarted meanwhile, into the same cgroup).
func (sc *Scanned) sweepLeftCgroups(ctx context.Context, rep *Report, live engine.Set) {
	opt, log := sc.opt, sc.log
	spare := contradicted(rep.Trees)
	for _, t := range rep.Trees {
		switch t.Action {
		case action.WouldReap, action.Reaped, action.Gone:
		default:
			for _, id := range t.tree.ContainerIDs {
				spare[id] = true
			}
			spare[t.ContainerID] = true
		}
	}
	for _, c := range rep.Cgroups {
		spare[c.ContainerID] = true // swept with its tree
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, 8) // a drain's cgroups, a few at a time
	)
	for _, l := range sc.cgroups {
		id := l.ContainerID
		switch {
		case spare[id], live.IsLive(id), !live.Vouches(l.Record.UID),
			len(opt.Containers) > 0 && !opt.Containers[id],
			sc.scanned.Sub(l.Changed) < opt.MinAge:
			continue
		}
		spare[id] = true // listed on both hierarchies: one sweep
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
			c := Cgroup{ContainerID: id, Cgroup: sweepListed(ctx, opt, log, l, sc.bootTicks)}
			mu.Lock()
			rep.Cgroups = append(rep.Cgroups, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.SortFunc(rep.Cgroups, func(a, b Cgroup) int { return strings.Compare(a.ContainerID, b.ContainerID) })
}

func sweepListed(ctx context.Context, opt Options, log *slog.Logger, l contain.Listed, bornBefore uint64) ledger.Cgroup {
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
	res := contain.Sweep(ctx, cg, contain.SweepOptions{Root: opt.Root, BornBefore: bornBefore})
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
