package trees

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	helper "github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestScanGivesUpOnAStalledArgv: a user's process named kcserver, with a
// container ID in its argv, holds its memory map's lock for a FUSE server
// that never answers (see fingerprint's
// TestArgvOfAProcessFaultingOnAnUnansweringFUSEFile). Every scan returns,
// finds the other trees, never offers the user's group for a signal, and
// names the process in Stats.Stalled for the warning.
func TestScanGivesUpOnAStalledArgv(t *testing.T) {
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: cidLive, Children: 1})
	const cidUser = "3333333333333333333333333333333333333333333333333333333333333333"
	h, held := helper.HoldMemoryLock(t, "kcserver", "--container-id="+cidUser)
	if !held {
		t.Skip("this kernel does not hold the memory map's lock over the fault: nothing stalls")
	}
	for _, tc := range []struct {
		name string
		opt  Options
	}{
		{"bpf", Options{Lister: proctable.ListBPF}},
		{"proc", Options{Lister: proctable.ListProc}},
		{"full", Options{Full: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := tc.opt
			opt.Comms = []string{"kcserver"}
			type result struct {
				trees []Tree
				stats Stats
				err   error
			}
			got := testutil.Within(t, 20*time.Second, "scan", func() result {
				ts, st, err := Scan(opt)
				return result{ts, st, err}
			})
			if got.err != nil {
				t.Fatal(got.err)
			}
			if tr := findTree(got.trees, k.PGID); tr == nil || !tr.Signalable() {
				t.Errorf("the other tree: %+v, want it found and signalable", tr)
			}
			if tr := findTree(got.trees, h.PID); tr != nil && tr.Signalable() && tr.AgeKnown {
				t.Errorf("the stalled group was offered for a signal: %+v", tr)
			}
			if !slices.Contains(got.stats.Stalled, h.PID) {
				if h.Mapped(5 * time.Second) {
					t.Skip("the mapping was only slow: nothing held the lock")
				}
				t.Errorf("Stalled = %v, want %d among them", got.stats.Stalled, h.PID)
			}
		})
	}
	// As an escaped descendant (here of this test process, its parent):
	// reported, never signalled.
	t.Run("descendant", func(t *testing.T) {
		self, err := fingerprint.Read("/proc", os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		escaped, withheld := Descendants("/proc", nil, []fingerprint.Identity{self}, Rules{InGroup: func(int) bool { return false }, UID: 0, ContainerID: cidLive})
		if slices.ContainsFunc(escaped, func(id fingerprint.Identity) bool { return id.PID == h.PID }) {
			t.Errorf("the stalled process is among the escaped, to be signalled")
		}
		if !slices.ContainsFunc(withheld, func(id fingerprint.Identity) bool { return id.PID == h.PID }) {
			t.Errorf("the stalled process is not reported withheld (%d withheld)", len(withheld))
		}
	})
}
