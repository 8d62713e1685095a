package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// ErrWrongStore is returned (wrapped) when, on root's evidence, more than
// one container no engine knows at all still runs here: the answer is
// not this host's truth, so the whole run is treated as unknown.
var ErrWrongStore = fmt.Errorf("%w: more than one container the engines do not list still runs here; the engine is probably asked about the wrong store (a different --root, another user's service)", engine.ErrUnknown)

// corroborate checks every would-be stray against local evidence and
// marks the contradicted ones. It returns, by container, those that
// count toward the wrong-store rule (root's evidence for containers no
// engine knows: a user can fake his own, and a container an engine lists
// as exited is a burst of deaths, not a wrong store) and why.
func (sc *Scanned) corroborate(ts []Tree, live engine.Set) map[string]string {
	var candidates []*Tree
	for i := range ts {
		if ts[i].Action == action.WouldReap {
			candidates = append(candidates, &ts[i])
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	ck := sc.checker()
	why := map[string]string{}
	for _, t := range candidates {
		known := live.ListedFor(t.ContainerID, t.UID)
		q := corroborate.Query{ID: t.ContainerID, UID: t.UID, Exited: known}
		for _, m := range t.tree.Members {
			q.Members = append(q.Members, m.PID)
		}
		ev, running, err := ck.Check(q)
		var msg string
		switch {
		case running:
			msg = fmt.Sprintf("container %s is not listed as running by the engines but %s", t.ContainerID, ev)
		case err != nil:
			// Without the walk nothing rules the container out.
			msg = fmt.Sprintf("container %s: cannot look for evidence of it running: %v", t.ContainerID, err)
		default:
			continue
		}
		t.Action = action.SkipContradicted
		t.Error = &msg
		if running && ev.Root() && !known {
			why[t.ContainerID] = msg
		}
		sc.log.Warn("ground truth contradicted; tree left alone", "container", t.ContainerID, "pgid", t.PGID, "evidence", msg)
	}
	return why
}

// wrongStore is the error of a run whose evidence (by container) says
// its answer is the wrong one, or nil: one contradicted container is a
// race, more than one are not (two trees of one are one).
func wrongStore(why ...map[string]string) error {
	all := map[string]string{}
	for _, w := range why {
		maps.Copy(all, w)
	}
	if len(all) < 2 {
		return nil
	}
	msgs := slices.Sorted(maps.Values(all))
	return fmt.Errorf("%w: %s", ErrWrongStore, strings.Join(msgs, "; "))
}

// checker looks for evidence in the run's one snapshot: one for the
// run, so that its trees and its left cgroups read the monitors' children
// once.
func (sc *Scanned) checker() *corroborate.Checker {
	if sc.ck == nil {
		boot := ""
		if sc.opt.Store != nil {
			boot = sc.opt.Store.CurrentBootID()
		}
		sc.ck = corroborate.New(sc.opt.Root, sc.snap, sc.records, boot)
	}
	return sc.ck
}
