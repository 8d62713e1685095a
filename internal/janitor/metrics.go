package janitor

import (
	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// RecordReconcile records a reconcile report of command (reconcile,
// doctor, watch). known is false when the engines could not be asked (the
// report is then empty).
func RecordReconcile(s *metrics.Set, command string, rep reconcile.Report, known bool) {
	if s == nil {
		return
	}
	s.Bool(metrics.GroundTruthKnown, known, command)
	if !known {
		// Nothing was looked at: the last counts are not current any
		// more, and are taken out rather than left to be read as such.
		s.Drop(metrics.Trees, metrics.StraysFound, metrics.StraysReaped, metrics.StraysFailed)
		return
	}
	counts := map[action.Action]int{}
	for _, a := range []action.Action{action.WouldReap, action.Reaped, action.Gone, action.WouldNotDie,
		action.SkipLive, action.SkipYoung, action.SkipAgeUnknown, action.SkipForeign,
		action.SkipOtherUID, action.SkipAmbiguous, action.SkipContradicted} {
		counts[a] = 0 // every action present, so an old value never lingers
	}
	for _, t := range rep.Trees {
		counts[t.Action]++
	}
	for a, n := range counts {
		s.Set(metrics.Trees, float64(n), string(a))
	}
	found := counts[action.WouldReap] + counts[action.Reaped] + counts[action.Gone] + counts[action.WouldNotDie]
	s.Set(metrics.StraysFound, float64(found))
	s.Set(metrics.StraysReaped, float64(counts[action.Reaped]+counts[action.Gone]))
	s.Set(metrics.StraysFailed, float64(counts[action.WouldNotDie]))
}

// RecordSweep records the reports of one round's sweeps (a watch
// scoped to several containers sweeps each), summed.
func RecordSweep(s *metrics.Set, reps ...*sweep.Report) {
	if s == nil || len(reps) == 0 {
		return
	}
	verdicts := map[sweep.Verdict]int{sweep.VerdictLive: 0, sweep.VerdictStale: 0, sweep.VerdictUnknown: 0}
	unlinked, failed := 0, 0
	for _, rep := range reps {
		for _, k := range rep.Sockets {
			verdicts[k.Verdict]++
			switch k.Action {
			case sweep.ActionUnlinked:
				unlinked++
			case sweep.ActionFailed:
				failed++
			}
		}
	}
	for v, n := range verdicts {
		s.Set(metrics.Sockets, float64(n), string(v))
	}
	s.Set(metrics.SocketsStale, float64(verdicts[sweep.VerdictStale]))
	s.Set(metrics.SocketsUnlinked, float64(unlinked))
	s.Set(metrics.SocketsFailed, float64(failed))
}

// DropSweepAndCull takes the sweep's and cull's counts out of the file:
// a round that could not look (the containers to sweep could not be
// found) must not leave the last ones to be read as current.
func DropSweepAndCull(s *metrics.Set) {
	s.Drop(metrics.Sockets, metrics.SocketsStale, metrics.SocketsUnlinked, metrics.SocketsFailed,
		metrics.Supervisors, metrics.SupervisorsUnreadable, metrics.SessionsAbandoned, metrics.SessionsAbandonedMemoryBytes)
}

// RecordCull records a cull audit.
func RecordCull(s *metrics.Set, sups []cull.Supervisor) {
	if s == nil {
		return
	}
	unreadable, sessions := 0, 0
	var mem int64
	for _, sup := range sups {
		if sup.Err != nil {
			unreadable++
			continue
		}
		for _, c := range sup.Candidates {
			sessions++
			mem = kallichore.AddBytes(mem, c.MemoryBytes())
		}
		sessions += sup.Unlisted
		mem = kallichore.AddBytes(mem, sup.UnlistedMemoryBytes)
	}
	s.Set(metrics.Supervisors, float64(len(sups)))
	s.Set(metrics.SupervisorsUnreadable, float64(unreadable))
	s.Set(metrics.SessionsAbandoned, float64(sessions))
	s.Set(metrics.SessionsAbandonedMemoryBytes, float64(mem))
}
