// Package reap is the one path that acts on supervisor trees a caller has
// decided are strays: it records them in the ledger, kills each group
// through pgkill, unlinks the sockets its members held and records the
// outcome. kc-hook's poststop (its container is dead) and reconcile (the
// engines, corroborated, say so; doctor --fix and watch reach it through
// reconcile) keep their own decision tables and act here, so the order of
// the steps and the refusals below exist once.
package reap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// Options configure Run.
type Options struct {
	// Root is the procfs mount; default /proc.
	Root string
	// Grace is the wait between SIGTERM and SIGKILL; pgkill's default
	// when zero.
	Grace time.Duration
	// Store records the trees and their outcome; nil acts without
	// recording (the ledger is bookkeeping: a hook whose state dir is
	// full or read-only still reaps).
	Store *ledger.Store
	// Source names the caller in the snapshots: "poststop", "reconcile".
	Source string
	// Stage, when set, is stamped on the record at each write (the
	// hook's "poststop").
	Stage string
	// Contain finds the cgroup a record names (and, with a systemd
	// client, stops its scope).
	Contain contain.Options
	// BornBefore, when set, withholds from a cgroup sweep every process
	// started after it (the caller's decision was made before: a restart
	// of the container may have put its new tree in the same cgroup).
	BornBefore uint64
	// Spare withholds from a cgroup sweep the processes it names
	// (contain.SweepOptions.Spare).
	Spare func(fingerprint.Stat) bool
	// Sockets, when set, are the socket and mount tables the reaps of
	// one decision share (a burst's hundred containers read them once);
	// nil reads them for this Run alone.
	Sockets *sockets.Shared
	Logger  *slog.Logger
}

// Tree is one tree to act on.
type Tree struct {
	trees.Tree
	// HostUID is the members' UID on the host, as the ledger records it,
	// or -1 when they have none (an unmapped UID seen from a user
	// namespace). The embedded UID stays what /proc showed the caller:
	// the members' sockets are looked up with it.
	HostUID int
}

// Container is one container's trees.
type Container struct {
	ID string
	// Pod is namespace/pod/container where an engine named it; it goes
	// into the audit line of each reaped tree.
	Pod   string
	Trees []Tree
	// All says Trees are every tree of the container (the hook scans for
	// exactly that): their snapshots replace the record's, and the record
	// is written even without a tree, to carry the stage and the outcome
	// "nothing". Otherwise only these groups' snapshots are replaced: the
	// container's other trees must stay attributable.
	All bool
	// KeepCgroup: another tree of the container was spared (too young,
	// ambiguous, foreign), which its cgroup may hold: no sweep.
	KeepCgroup bool
}

// Result is what became of one container's trees.
type Result struct {
	// Trees holds one snapshot per Container.Trees entry, in order, with
	// its Action (a refusal, or pgkill's outcome), Error, the sockets its
	// members held and those unlinked.
	Trees []ledger.Tree
	// Outcome sums them up: would-not-die if any tree would not die,
	// else reaped if any was reaped or gone, else nothing.
	Outcome action.Action
	// Cgroup is the supervisor's cgroup the record named, after its
	// sweep; nil when none was named (or it was removed before).
	Cgroup *ledger.Cgroup
	// Unrecorded is why the outcome could not be written, when it could
	// not: the trees were still dealt with.
	Unrecorded error
}

// Failed reports whether a tree would not die.
func (r Result) Failed() bool { return r.Outcome == action.WouldNotDie }

// Run records c's trees, then kills every one it does not refuse (each in
// its own goroutine: one stubborn group must not hold up the others'
// grace), unlinks the sockets of those whose members are dead, and
// records the outcome.
func Run(ctx context.Context, opt Options, c Container) Result {
	if opt.Root == "" {
		opt.Root = fingerprint.DefaultRoot
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := time.Now()
	res := Result{Trees: make([]ledger.Tree, len(c.Trees))}
	held := make([][]sockets.TreeSocket, len(c.Trees))
	for i, t := range c.Trees {
		snap := ledger.Snapshot(t.Tree, opt.Source, now)
		snap.UID = t.HostUID
		// Listed while the members live: a dead process's sockets can no
		// longer be told from anyone else's.
		held[i] = sockets.TreeSockets(opt.Root, t.UID, t.PIDs(), opt.Sockets)
		for _, s := range held[i] {
			snap.Sockets = append(snap.Sockets, s.Path)
		}
		snap.Action = refusal(t)
		res.Trees[i] = snap
	}
	// Record before signalling: if this process is killed mid-run, the
	// next run still knows exactly which processes were this container's.
	if len(c.Trees) > 0 {
		if err := record(opt, c, res.Trees, "", nil); err != nil {
			log.Warn("could not record trees before reaping", "container", c.ID, "err", err)
		}
	}

	var wg sync.WaitGroup
	signalled, refused := map[int]bool{}, false
	for i, t := range c.Trees {
		snap := &res.Trees[i]
		if snap.Action != "" {
			log.Info("not signalling tree", "pgid", t.PGID, "reason", snap.Action, "container_ids", t.ContainerIDs)
			refused = true
			continue
		}
		signalled[t.HostUID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			kill(ctx, opt, log, c, t, held[i], snap)
		}()
	}
	wg.Wait()

	// After the groups' polite stop, what is left in the supervisor's
	// cgroup: a daemon, a setsid child's fork loop. Not when a tree was
	// refused: the cgroup may hold it. The caller's decision covers the
	// UIDs of the trees it gave: a cgroup of another UID (root's wrapper
	// where a rootless engine answered) is swept only by the hook's
	// poststop, which is the container's own. A cgroup no record names
	// is looked for by poststop only; reconcile finds those itself.
	if !refused && !c.KeepCgroup {
		res.Cgroup = sweep(ctx, opt, log, c.ID, c.All, func(uid int) bool { return c.All || signalled[uid] })
	}
	res.Outcome = summary(res.Trees)
	if res.Cgroup != nil {
		switch {
		case res.Cgroup.Outcome == action.WouldNotDie:
			res.Outcome = action.WouldNotDie
		case res.Cgroup.Outcome == action.Reaped && res.Outcome == action.Nothing:
			res.Outcome = action.Reaped
		}
	}
	if len(c.Trees) > 0 || c.All || res.Cgroup != nil {
		if err := record(opt, c, res.Trees, res.Outcome, res.Cgroup); err != nil {
			log.Warn("could not record the outcome", "container", c.ID, "err", err)
			res.Unrecorded = err
		}
	}
	return res
}

// refusal is why a tree is never signalled, whoever called it a stray
// (DESIGN "Identity rules"): a group led by a foreign process, or holding the caller
// itself; members naming two containers; members with no UID on the
// host; a tree read in part (trees.Tree.Partial), whose members' argv no
// one has seen, so that another container's ID among them is not ruled
// out. Callers decide before this; it holds whatever they decided.
func refusal(t Tree) action.Action {
	switch {
	case t.Foreign || t.HoldsCaller():
		return action.SkipForeign
	case t.Ambiguous || t.Partial:
		return action.SkipAmbiguous
	case t.HostUID < 0, t.UID < 0:
		// No UID to signal as: pgkill's UID check needs one.
		return action.SkipOtherUID
	}
	return ""
}

// kill takes one group down through pgkill (which revalidates every
// member's PID and start time at signal time) and, once its members are
// dead, unlinks the sockets they held.
func kill(ctx context.Context, opt Options, log *slog.Logger, c Container, t Tree, held []sockets.TreeSocket, snap *ledger.Tree) {
	// refusal turned away a tree of unknown UID; pgkill refuses one too.
	popt := pgkill.Options{Root: opt.Root, Grace: opt.Grace, UID: t.Tree.UID, CheckUID: true}
	// The escaped members share the group's grace rather than wait for
	// it to end: a kernel's setsid child must not double the stop time.
	var esc pgkill.Result
	var wg sync.WaitGroup
	if len(t.Escaped) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			esc = pgkill.KillEscaped(ctx, escapedStats(t.Tree), t.Tree.UID, popt)
		}()
	}
	r := pgkill.Kill(ctx, pgkill.Group{PGID: t.PGID, Members: t.Stats()}, popt)
	wg.Wait()
	r.Outcome, r.Err = merge(r, esc, len(t.Escaped) > 0)
	snap.Action = r.Outcome
	if r.Err != nil {
		snap.Error = r.Err.Error()
	}
	if c.Pod != "" {
		log = log.With("pod", c.Pod)
	}
	log.Info("[REAP] stray tree", "container", c.ID, "pgid", t.PGID, "action", r.Outcome, "signals", fmt.Sprint(r.Signals),
		"escaped", len(t.Escaped), "escaped_signals", fmt.Sprint(esc.Signals), "withheld", len(t.Withheld), "err", r.Err)
	if r.Outcome == action.WouldNotDie {
		return // a live owner keeps its sockets
	}
	for i, err := range sockets.RemoveTreeSockets(held, opt.Sockets) {
		if err != nil {
			log.Warn("socket left in place", "path", held[i].Path, "err", err)
			continue
		}
		snap.SocketsUnlinked = append(snap.SocketsUnlinked, held[i].Path)
	}
}

// escapedStats are the escaped members' identities, as pgkill pins them.
func escapedStats(t trees.Tree) []fingerprint.Stat {
	out := make([]fingerprint.Stat, len(t.Escaped))
	for i, m := range t.Escaped {
		out[i] = m.Stat
	}
	return out
}

// merge sums up a tree's kill: would-not-die if the group or an escaped
// member would not die, reaped if either was signalled, gone when neither
// had anything left.
func merge(group, esc pgkill.Result, hadEscaped bool) (action.Action, error) {
	if !hadEscaped {
		return group.Outcome, group.Err
	}
	err := errors.Join(group.Err, esc.Err)
	switch {
	case group.Outcome == action.WouldNotDie || esc.Outcome == action.WouldNotDie:
		return action.WouldNotDie, err
	case group.Outcome == action.Reaped || esc.Outcome == action.Reaped:
		return action.Reaped, err
	}
	return group.Outcome, err
}

func summary(snaps []ledger.Tree) action.Action {
	out := action.Nothing
	for _, s := range snaps {
		switch {
		case s.Action == action.WouldNotDie:
			return action.WouldNotDie
		case s.Action.Killed():
			out = action.Reaped
		}
	}
	return out
}

// record writes c's snapshots and, when set, the outcome, under the
// ledger's lock.
func record(opt Options, c Container, snaps []ledger.Tree, outcome action.Action, cg *ledger.Cgroup) error {
	if opt.Store == nil {
		return nil
	}
	return opt.Store.Update(c.ID, func(r *ledger.Record) error {
		if opt.Stage != "" {
			if r.Stages == nil {
				r.Stages = map[string]time.Time{}
			}
			r.Stages[opt.Stage] = time.Now().UTC()
		}
		if c.All {
			r.Trees = slices.Clone(snaps)
		} else {
			r.Trees = slices.DeleteFunc(r.Trees, func(lt ledger.Tree) bool {
				return slices.ContainsFunc(snaps, func(s ledger.Tree) bool { return s.PGID == lt.PGID })
			})
			r.Trees = append(r.Trees, snaps...)
		}
		if outcome != "" {
			r.Outcome = string(outcome)
		}
		if cg != nil {
			r.Cgroup = cg
		}
		return nil
	})
}
