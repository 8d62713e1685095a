package reap

import (
	"context"
	"log/slog"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// sweep reaps what is left in the cgroup the container's record names
// (DESIGN "Descendants that leave the group"), once: a cgroup already
// removed is not looked at again. The record's path is trusted only as
// far as contain.FromRecord validates it (kc-watchman's own places, no
// "..", no symlinks); a refused one is recorded as such and never
// touched. Nil when the record names none.
func sweep(ctx context.Context, opt Options, log *slog.Logger, id string) *ledger.Cgroup {
	if opt.Store == nil {
		return nil
	}
	rec, err := opt.Store.Load(id)
	if err != nil || rec.Cgroup == nil || rec.Cgroup.Removed || !opt.Store.Current(rec) {
		return nil
	}
	lc := *rec.Cgroup
	cg, err := contain.FromRecord(lc, id, opt.Contain)
	if err != nil {
		log.Warn("[REAP] recorded cgroup refused", "container", id, "kind", lc.Kind, "path", lc.Path, "err", err)
		lc.Outcome, lc.Error = action.SkipForeign, err.Error()
		return &lc
	}
	defer cg.Close()
	res := contain.Sweep(ctx, cg, contain.SweepOptions{Root: opt.Root})
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
