package reconcile

import (
	"context"
	"os"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestRunCompletesPartialTrees: the scan reads a tree led by a live
// supervisor through its leader only, and a run reads in full every tree
// whose container the answer does not call live before deciding on it.
// A dead container's group that holds another container's ID on a member
// (not on the leader) is ambiguous: were it decided on its leader alone,
// it would be reaped.
func TestRunCompletesPartialTrees(t *testing.T) {
	const comm = "kcsrv-partial"
	gone, liveID, otherID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	mixed := testutil.StartMixedGroup(t, comm, gone, otherID)
	kept := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: liveID, Children: 1})

	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{gone: true, liveID: true, otherID: true}}
	sc, err := Scan(opt)
	if err != nil {
		t.Fatal(err)
	}
	partial := map[int]bool{}
	for _, tr := range sc.found {
		partial[tr.PGID] = tr.Partial
	}
	if !partial[mixed.PGID] || !partial[kept.PGID] {
		t.Fatalf("the scan read in full a group its leader settles (partial: %v; want groups %d and %d)", partial, mixed.PGID, kept.PGID)
	}
	rep, err := sc.Run(context.Background(), live)
	if err != nil {
		t.Fatal(err)
	}
	if tr := findByPGID(rep, mixed.PGID); tr == nil || tr.Action != action.SkipAmbiguous {
		t.Errorf("a gone container's group with another's ID on a member: %+v, want %s", tr, action.SkipAmbiguous)
	}
	tr := findByPGID(rep, kept.PGID)
	if tr == nil || tr.Action != action.SkipLive || tr.ContainerID != liveID || len(tr.Members) != 3 {
		t.Errorf("a live container's tree: %+v, want %s with its 3 members", tr, action.SkipLive)
	}
	if n := alive(t, tr.Members); n != 3 {
		t.Errorf("%d of the live tree's members alive, want 3", n)
	}
}
