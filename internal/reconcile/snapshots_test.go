package reconcile

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// TestSameTrees: a live container's record is rewritten only when its
// trees changed; when they were seen does not count.
func TestSameTrees(t *testing.T) {
	tree := func(pgid, uid int, source string, seen time.Time, members ...ledger.Process) ledger.Tree {
		return ledger.Tree{PGID: pgid, UID: uid, Source: source, SeenAt: seen, Members: members}
	}
	a, b := ledger.Process{PID: 10, StartTicks: 5, Comm: "kcserver"}, ledger.Process{PID: 11, StartTicks: 6, Comm: "python3"}
	then, now := time.Unix(1000, 0), time.Unix(2000, 0)
	rec := []ledger.Tree{tree(10, 0, "reconcile", then, a, b)}
	for _, c := range []struct {
		name string
		snap []ledger.Tree
		same bool
	}{
		{"same, seen later", []ledger.Tree{tree(10, 0, "reconcile", now, a, b)}, true},
		{"a member gone", []ledger.Tree{tree(10, 0, "reconcile", now, a)}, false},
		{"a member recycled", []ledger.Tree{tree(10, 0, "reconcile", now, a, ledger.Process{PID: 11, StartTicks: 7, Comm: "python3"})}, false},
		{"another UID", []ledger.Tree{tree(10, 1000, "reconcile", now, a, b)}, false},
		{"recorded by the wrapper", []ledger.Tree{tree(10, 0, "supervise", now, a, b)}, false},
		{"a second tree", []ledger.Tree{tree(10, 0, "reconcile", now, a, b), tree(20, 0, "reconcile", now, a)}, false},
		{"none", nil, false},
	} {
		if got := sameTrees(rec, c.snap); got != c.same {
			t.Errorf("%s: sameTrees = %v, want %v", c.name, got, c.same)
		}
	}
	if sameTrees(nil, nil) {
		t.Error("an empty record is never the same: there is nothing to keep")
	}
}
