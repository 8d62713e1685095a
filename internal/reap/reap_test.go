package reap

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// A supervisor name of this package's own, so that no other package's
// scan takes these trees for its own.
const comm = "kcsrv-reap"

// startTree starts a real fake-kcserver tree for container id (its
// wrapper leads the group, one child) and returns it as a scan sees it.
func startTree(t *testing.T, id string) (*testutil.KCServer, trees.Tree) {
	t.Helper()
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: id, Children: 1})
	found, _, err := trees.Scan(trees.Options{Comms: []string{comm}, Only: map[string]bool{id: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range found {
		if tr.PGID == k.PGID {
			return k, tr
		}
	}
	t.Fatalf("the scan did not find tree %d: %+v", k.PGID, found)
	return nil, trees.Tree{}
}

func alive(tr trees.Tree) int {
	n := 0
	for _, m := range tr.Members {
		if fingerprint.Alive(fingerprint.DefaultRoot, m.Stat) {
			n++
		}
	}
	return n
}

// TestRunRefusesWhateverTheCallerDecided: a tree led by a foreign
// process, naming two containers, read in part or with no host UID is
// recorded and left alone — members alive, socket in place — even when a
// caller hands it over as a stray.
func TestRunRefusesWhateverTheCallerDecided(t *testing.T) {
	tests := []struct {
		name string
		bend func(*Tree)
		want action.Action
	}{
		{"foreign leader", func(tr *Tree) { tr.Foreign = true }, action.SkipForeign},
		{"two containers", func(tr *Tree) { tr.Ambiguous = true }, action.SkipAmbiguous},
		{"read in part", func(tr *Tree) { tr.Partial = true }, action.SkipAmbiguous},
		{"no host uid", func(tr *Tree) { tr.HostUID = -1 }, action.SkipOtherUID},
		{"no uid as seen", func(tr *Tree) { tr.UID = -1 }, action.SkipOtherUID},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := testID(i)
			k, found := startTree(t, id)
			store, err := ledger.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			tr := Tree{Tree: found, HostUID: found.UID}
			tt.bend(&tr)
			res := Run(context.Background(), Options{Grace: 200 * time.Millisecond, Store: store, Source: "test"}, Container{ID: id, Trees: []Tree{tr}, All: true})
			if len(res.Trees) != 1 || res.Trees[0].Action != tt.want || res.Outcome != action.Nothing || res.Failed() {
				t.Fatalf("Run = %+v, want the tree %s and outcome nothing", res, tt.want)
			}
			if n := alive(found); n != len(found.Members) {
				t.Errorf("%d of %d members alive after a refusal", n, len(found.Members))
			}
			if _, err := os.Lstat(k.Socket); err != nil {
				t.Errorf("socket of a refused tree: %v", err)
			}
			rec, err := store.Load(id)
			if err != nil || len(rec.Trees) != 1 || rec.Trees[0].Action != tt.want || rec.Outcome != string(action.Nothing) {
				t.Errorf("record %+v, %v; want the refusal and outcome nothing", rec, err)
			}
		})
	}
}

// TestRunSignalsAsTheTreesUID: a tree the caller gives as uid 65534's
// whose processes are root's (they ran setuid, or joined it) is not
// signalled: every signal of a tree goes out under its UID's rules.
func TestRunSignalsAsTheTreesUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree's processes must be another UID's than its own")
	}
	id := testID(20)
	k, found := startTree(t, id)
	if found.UID != 0 {
		t.Fatalf("the tree runs as uid %d, want root's", found.UID)
	}
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tr := Tree{Tree: found, HostUID: 65534}
	tr.Tree.UID = 65534
	res := Run(context.Background(), Options{Grace: 200 * time.Millisecond, Store: store, Source: "test"}, Container{ID: id, Trees: []Tree{tr}})
	if len(res.Trees) != 1 || res.Trees[0].Action != action.WouldNotDie || res.Trees[0].Error == "" {
		t.Fatalf("Run = %+v, want the tree would-not-die with the reason", res)
	}
	if n := alive(found); n != len(found.Members) {
		t.Errorf("%d of %d members alive after a refusal", n, len(found.Members))
	}
	for _, m := range found.Members {
		if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, m.PID); err != nil || st.State == 'T' {
			t.Errorf("member %d: %+v, %v; want it running, not left stopped", m.PID, st, err)
		}
	}
	if _, err := os.Lstat(k.Socket); err != nil {
		t.Errorf("socket of a tree not signalled: %v", err)
	}
}

// TestRunReaps: a tree reap may act on is killed, its socket unlinked,
// and the ledger says so. Without All only its own snapshot is replaced;
// with All the container's snapshots are the ones given, and the stage
// is stamped.
func TestRunReaps(t *testing.T) {
	const other = 999999 // a snapshot of another of the container's groups
	tests := []struct {
		name      string
		all       bool
		stage     string
		wantTrees int
	}{
		{"one of the container's trees", false, "", 2},
		{"all of the container's trees", true, "poststop", 1},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := testID(10 + i)
			k, found := startTree(t, id)
			store, err := ledger.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			err = store.Update(id, func(r *ledger.Record) error {
				r.Trees = []ledger.Tree{{PGID: other, Source: "reconcile"}, {PGID: found.PGID, Source: "reconcile"}}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			opt := Options{Grace: 200 * time.Millisecond, Store: store, Source: "test", Stage: tt.stage}
			res := Run(context.Background(), opt, Container{ID: id, Trees: []Tree{{Tree: found, HostUID: found.UID}}, All: tt.all})
			if len(res.Trees) != 1 || res.Trees[0].Action != action.Reaped || res.Outcome != action.Reaped || res.Unrecorded != nil {
				t.Fatalf("Run = %+v, want reaped", res)
			}
			k.Wait(t)
			if n := alive(found); n != 0 {
				t.Errorf("%d members survived", n)
			}
			if _, err := os.Lstat(k.Socket); !os.IsNotExist(err) {
				t.Errorf("socket still there: %v", err)
			}
			if got := res.Trees[0]; !slices.Contains(got.Sockets, k.Socket) || !slices.Contains(got.SocketsUnlinked, k.Socket) {
				t.Errorf("snapshot sockets %v, unlinked %v; want %s in both", got.Sockets, got.SocketsUnlinked, k.Socket)
			}
			rec, err := store.Load(id)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(rec.Trees, func(lt ledger.Tree) bool { return lt.PGID == found.PGID })
			if rec.Outcome != string(action.Reaped) || len(rec.Trees) != tt.wantTrees || i < 0 || rec.Trees[i].Action != action.Reaped || rec.Trees[i].Source != "test" {
				t.Errorf("record: outcome %q, trees %+v; want reaped and %d trees", rec.Outcome, rec.Trees, tt.wantTrees)
			}
			if _, stamped := rec.Stages[tt.stage]; stamped != (tt.stage != "") {
				t.Errorf("stages %v, want %q stamped", rec.Stages, tt.stage)
			}
		})
	}
}

// testID is a container ID of this package's own: other packages' tests
// scan for theirs at the same time, and the supervise wrapper counts as a
// supervisor whatever the comm.
func testID(i int) string { return fmt.Sprintf("4ea9%060x", i) }
