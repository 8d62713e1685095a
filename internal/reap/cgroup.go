package reap

import (
	"context"
	"log/slog"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// sweep reaps what is left in the container's supervisor cgroup (DESIGN
// "Descendants that leave the group"), once: a cgroup already removed is
// not looked at again. The cgroup is the one the container's record
// names, trusted only as far as contain.FromRecord validates it
// (kc-watchman's own places, no "..", no symlinks; a refused one is
// recorded as such and never touched); else, with listed, the
// kc-watchman/<id> found on cgroupfs (a supervisor started by hand, or
// whose wrapper had no ledger). Only a cgroup of a UID uidOK accepts is
// swept. Nil when there is none, or it is not swept.
func sweep(ctx context.Context, opt Options, log *slog.Logger, id string, listed bool, uidOK func(int) bool) *ledger.Cgroup {
	lc, ok := recorded(opt, id)
	if !ok && listed {
		lc, ok = found(opt, log, id)
	}
	if !ok {
		return nil
	}
	if !uidOK(lc.UID) {
		log.Info("supervisor cgroup left: its UID is not one this decision covers", "container", id, "path", lc.Path, "uid", lc.UID)
		return nil
	}
	cg, err := contain.FromRecord(lc, id, opt.Contain)
	if err != nil {
		log.Warn("[REAP] recorded cgroup refused", "container", id, "kind", lc.Kind, "path", lc.Path, "err", err)
		lc.Outcome, lc.Error = action.SkipForeign, err.Error()
		return &lc
	}
	defer cg.Close()
	res := contain.Sweep(ctx, cg, contain.SweepOptions{Root: opt.Root, BornBefore: opt.BornBefore, Spare: opt.Spare})
	out := res.Record(cg)
	args := []any{"container", id, "cgroup", cg.String(), "action", res.Outcome, "method", res.Method,
		"killed", len(res.Killed), "withheld", len(res.Withheld), "frozen", res.Frozen, "empty", res.Empty, "removed", res.Removed, "err", res.Err}
	if res.Outcome == action.WouldNotDie {
		log.Error("[REAP] contained cgroup", args...)
	} else {
		log.Info("[REAP] contained cgroup", args...)
	}
	return &out
}

// recorded is the cgroup the container's current record names, if not
// removed yet.
func recorded(opt Options, id string) (ledger.Cgroup, bool) {
	if opt.Store == nil {
		return ledger.Cgroup{}, false
	}
	rec, err := opt.Store.Load(id)
	if err != nil || rec.Cgroup == nil || rec.Cgroup.Removed || !opt.Store.Current(rec) {
		return ledger.Cgroup{}, false
	}
	return *rec.Cgroup, true
}

// found is the container's kc-watchman/<id> on cgroupfs, if there is one.
func found(opt Options, log *slog.Logger, id string) (ledger.Cgroup, bool) {
	ls, err := contain.Find(opt.Contain, id)
	if err != nil {
		log.Warn("could not look for the container's kc-watchman cgroup", "err", err)
	}
	if len(ls) == 0 {
		return ledger.Cgroup{}, false
	}
	return ls[0].Record, true
}
