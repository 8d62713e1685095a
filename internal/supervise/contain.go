package supervise

import (
	"context"
	"os"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// prepareCgroup readies the command's cgroup (DESIGN "Descendants that
// leave the group"). Only the command goes in, never the wrapper: the
// wrapper must outlive what it kills, and a sweep refuses a cgroup that
// holds its caller. Containment is best effort: without it the command
// still starts, and the subreaper and the descendant walk remain.
func (r *runner) prepareCgroup() {
	h := contain.Detect(r.o.Contain)
	if h.Kind == contain.KindNone {
		r.log.Info("command not contained: subreaper only", "why", h.Why)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cg, err := contain.Prepare(ctx, h, r.o.ContainerID, os.Getuid())
	if err != nil {
		r.log.Warn("command not contained: no cgroup", "containment", h.String(), "err", err)
		return
	}
	r.cg = cg
}

// sweep reaps what the group's stop left in the cgroup: a double-forked
// daemon, a setsid child's fork loop. keep leaves the emptied cgroup for
// the command's restart.
func (r *runner) sweep(keep bool) {
	if r.cg == nil {
		return
	}
	if r.cg.Path == "" {
		// A scope never entered (its command never started): nothing of
		// the tree's is in it, and a record of a scope with no cgroup
		// would be refused by every later reap, said as a refusal.
		r.log.Info("cgroup sweep: the scope was never entered; nothing to sweep", "unit", r.cg.Unit)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := contain.Sweep(ctx, r.cg, contain.SweepOptions{Root: r.o.Root, KillWait: r.o.KillWait, Keep: keep, UIDs: r.uids})
	r.reapAdopted()
	args := []any{"cgroup", r.cg.String(), "action", res.Outcome, "method", res.Method, "killed", describe(res.Killed), "frozen", res.Frozen, "removed", res.Removed}
	for _, w := range res.Withheld {
		r.log.Warn("process in the cgroup not signalled: another UID's (or setuid), another container's or a monitor", "pid", w.PID, "comm", w.Comm, "uid", w.UID, "euid", w.EUID, "suid", w.SUID)
	}
	switch {
	case res.Outcome == action.WouldNotDie || res.Err != nil:
		r.log.Error("cgroup sweep", append(args, "err", res.Err)...)
	case len(res.Killed) > 0:
		r.log.Warn("cgroup sweep: processes outlived the group's stop", args...)
	default:
		r.log.Info("cgroup sweep", args...)
	}
	if !keep {
		r.recordCgroup(res.Record(r.cg))
	}
}

// recordCgroup writes the cgroup and its last sweep into the record.
func (r *runner) recordCgroup(c ledger.Cgroup) {
	if r.o.Store == nil {
		return
	}
	err := r.o.Store.Update(r.o.ContainerID, func(rec *ledger.Record) error {
		rec.Cgroup = &c
		return nil
	})
	if err != nil {
		r.log.Warn("could not record the cgroup", "err", err)
	}
}
