package trees

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
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

// TestCompletionGivesUpOnAStalledMember: a partial tree's leader reads
// well, and a member of its group holds its memory map's lock. Completing
// the tree returns, reads it without that member and of unknown age, and
// names the member in the Completer's Stalled for reconcile's warning.
func TestCompletionGivesUpOnAStalledMember(t *testing.T) {
	const comm = "kcsrv-stallmem"
	cid := testutil.RandomHex(t, 64)
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	leader, err := helper.StartLockHolder(&syscall.SysProcAttr{Setpgid: true}, plain, comm, "--container-id="+cid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Close)
	member, held := helper.HoldMemoryLockIn(t, &syscall.SysProcAttr{Setpgid: true, Pgid: leader.PID}, "kernel")
	if !held {
		t.Skip("this kernel does not hold the memory map's lock over the fault: nothing stalls")
	}
	ts, _, err := Scan(Options{Comms: []string{comm}, Lister: proctable.ListBPF, Partial: true})
	if err != nil {
		t.Fatal(err)
	}
	tr := findTree(ts, leader.PID)
	if tr == nil || !tr.Partial {
		t.Fatalf("the group as scanned: %+v, want a partial tree", tr)
	}
	var cp Completer
	defer cp.Close()
	type result struct {
		tr Tree
		ok bool
	}
	got := testutil.Within(t, 20*time.Second, "completion", func() result {
		full, ok := cp.Complete(*tr)
		return result{full, ok}
	})
	if !got.ok {
		t.Fatal("completed to no tree")
	}
	full := got.tr
	if full.Signalable() && full.AgeKnown {
		t.Errorf("the tree with a stalled member was offered for a signal: %+v", full)
	}
	if !slices.Contains(cp.Stalled(), member.PID) {
		if member.Mapped(5 * time.Second) {
			t.Skip("the mapping was only slow: nothing held the lock")
		}
		t.Errorf("Stalled = %v, want %d among them", cp.Stalled(), member.PID)
	}
}
