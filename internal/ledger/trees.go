package ledger

import (
	"time"

	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// KnownFrom builds trees.Options.Known from records of the current boot.
// Records from another boot name processes that no longer exist and are
// never used.
func KnownFrom(recs []*Record, bootID string) map[trees.Key]string {
	m := map[trees.Key]string{}
	for _, r := range recs {
		if r.BootID != bootID {
			continue
		}
		for _, t := range r.Trees {
			// A snapshot of a group that was not the container's to reap
			// (ambiguous, foreign, another UID) must not make it so later,
			// once its anchors are gone.
			if t.Action.IsSkip() {
				continue
			}
			for _, p := range t.Members {
				if p.Escaped {
					continue // outside the group: no key of it names the tree
				}
				m[trees.Key{PID: p.PID, StartTicks: p.StartTicks, PGID: t.PGID}] = r.ContainerID
			}
		}
	}
	return m
}

// Snapshot converts a tree found by a scan to its ledger form.
func Snapshot(t trees.Tree, source string, now time.Time) Tree {
	lt := Tree{PGID: t.PGID, UID: t.UID, Source: source, SeenAt: now.UTC()}
	for _, m := range t.Members {
		lt.Members = append(lt.Members, Process{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm})
	}
	for _, m := range t.Escaped {
		lt.Members = append(lt.Members, Process{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm, Escaped: true})
	}
	for _, m := range t.Withheld {
		lt.Withheld = append(lt.Withheld, Process{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm})
	}
	return lt
}
