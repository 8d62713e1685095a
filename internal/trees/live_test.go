package trees

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testkit"
)

const cidLive = "1111111111111111111111111111111111111111111111111111111111111111"

func findTree(ts []Tree, pgid int) *Tree {
	for i := range ts {
		if ts[i].PGID == pgid {
			return &ts[i]
		}
	}
	return nil
}

func TestScanRealSupervisor(t *testing.T) {
	dir := t.TempDir()
	k := testkit.StartKCServer(t, dir, "--container-id="+cidLive, "--children=2")
	bare := testkit.StartKCServer(t, t.TempDir()) // no container ID: never a tree

	got, stats, err := Scan(Options{Comms: []string{"kcserver"}})
	if err != nil {
		t.Fatal(err)
	}
	tr := findTree(got, k.PID)
	if tr == nil {
		t.Fatalf("tree of fake kcserver %d not found among %d trees (stats %+v)", k.PID, len(got), stats)
	}
	if tr.ContainerID != cidLive || !tr.Signalable() || !tr.AgeKnown || tr.UID != 0 {
		t.Errorf("tree = %+v", tr)
	}
	if len(tr.Members) != 3 {
		t.Errorf("members = %d, want 3 (kcserver + 2 children)", len(tr.Members))
	}
	if findTree(got, bare.PID) != nil {
		t.Errorf("a kcserver without a container ID was reported as a tree")
	}
	socks := TreeSockets("/proc", *tr)
	if len(socks) != 1 || socks[0].Path != k.Socket || socks[0].Owner != k.PID {
		t.Errorf("TreeSockets = %+v, want [%q] held by %d", socks, k.Socket, k.PID)
	}
	if stats.FullReads >= stats.Processes {
		t.Errorf("fast scan read %d full identities for %d processes", stats.FullReads, stats.Processes)
	}
}

// TestFastScanMatchesFullScan checks that the optimised scan makes the same
// decisions about what may be signalled as the simple scan that reads every
// process, on the same live process table.
func TestFastScanMatchesFullScan(t *testing.T) {
	for i := 0; i < 3; i++ {
		testkit.StartKCServer(t, t.TempDir(), "--container-id="+cidLive, "--children=1")
	}
	testkit.StartKCServer(t, t.TempDir(), "--children=1")

	for _, p := range pipelines {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) { fastMatchesFull(t, p) })
	}
}

func fastMatchesFull(t *testing.T, p pipelineTuning) {
	signalable := func(full bool) []summary {
		opt := Options{Comms: []string{"kcserver"}, Full: full}
		if !full {
			opt.pipeline = p
		}
		ts, _, err := Scan(opt)
		if err != nil {
			t.Fatal(err)
		}
		var keep []Tree
		for _, tr := range ts {
			if tr.Signalable() {
				keep = append(keep, tr)
			}
		}
		return summarise(keep)
	}
	// Processes may come and go between the two scans (other tests, the
	// system); retry a few times before calling it a disagreement.
	var fast, full []summary
	for try := 0; try < 5; try++ {
		fast, full = signalable(false), signalable(true)
		if reflect.DeepEqual(fast, full) {
			if len(fast) < 3 {
				t.Fatalf("expected at least the 3 fake trees, got %d", len(fast))
			}
			return
		}
	}
	t.Errorf("fast and full scans disagree:\nfast %+v\nfull %+v", fast, full)
}
