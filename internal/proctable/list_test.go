package proctable

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestListIsComplete: a process the task iterator leaves out (as the
// kernel has been seen to leave out PID 1) is in the listing all the
// same, with its group and its leader's verdict: List confirms the pass
// against /proc when the census cannot vouch for it, and a deferred
// listing is complete once confirmed.
func TestListIsComplete(t *testing.T) {
	leader := exec.Command("sleep", "1000")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leader.Process.Kill(); leader.Wait() })
	pid := leader.Process.Pid
	hide := func(p int) bool { return p == pid }
	named := map[string]bool{"sleep": true}

	has := func(t *testing.T, l *Listing) {
		t.Helper()
		i := slices.Index(l.PIDs, pid)
		if i < 0 || int(l.PGIDs[i]) != pid {
			t.Fatalf("%s listing of %d processes lacks %d in its own group", l.Lister, len(l.PIDs), pid)
		}
		j := slices.IndexFunc(l.Leaders, func(ld Leader) bool { return ld.PID == pid })
		if j < 0 || l.Leaders[j].State != Live || l.Leaders[j].Comm != "sleep" {
			t.Fatalf("leader %d: %+v, want it live and named sleep", pid, l.Leaders[max(j, 0)])
		}
		// A listing with parent links has them for what Confirm added
		// too: walked alone, a link missing hides what runs below.
		if l.PPIDs != nil && (int(l.PPIDs[i]) != os.Getpid() || l.Starts[i] == 0 || l.PPIDsPartial) {
			t.Fatalf("%d listed with parent %d, start %d (partial %v); want ours, its start", pid, l.PPIDs[i], l.Starts[i], l.PPIDsPartial)
		}
	}
	for _, lister := range []Lister{ListProc, ListBPF} {
		t.Run(lister.String(), func(t *testing.T) {
			l, err := List(Options{Lister: lister, Named: named, Hide: hide})
			if taskiter.Unsupported(err) {
				t.Skipf("task iterator not usable here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			has(t, l)
			if lister == ListBPF && (!l.Confirmed || l.Missed < 1 || l.Pending()) {
				t.Errorf("Confirmed %v, Missed %d, Pending %v: want the hidden process found by confirming", l.Confirmed, l.Missed, l.Pending())
			}
		})
	}
	t.Run("deferred", func(t *testing.T) {
		l, err := List(Options{Lister: ListBPF, Named: named, Hide: hide, Defer: true})
		if taskiter.Unsupported(err) {
			t.Skipf("task iterator not usable here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !l.Pending() || slices.Contains(l.PIDs, pid) {
			t.Fatalf("Pending %v, hidden process listed %v: want a pending listing without it", l.Pending(), slices.Contains(l.PIDs, pid))
		}
		l.Prefetch()
		grouped, err := l.Confirm()
		if err != nil {
			t.Fatal(err)
		}
		if grouped < 1 || l.Pending() {
			t.Errorf("Confirm: %d grouped processes added, Pending %v", grouped, l.Pending())
		}
		has(t, l)
	})
}

// TestListBPFRefusesAnotherRoot: the task iterator lists the host's
// processes only, so it cannot stand for another procfs root.
func TestListBPFRefusesAnotherRoot(t *testing.T) {
	if _, err := List(Options{Root: t.TempDir(), Lister: ListBPF}); !errors.Is(err, ErrNoIterator) {
		t.Fatalf("List of another root with ListBPF: err = %v, want ErrNoIterator", err)
	}
}

// TestListKeepsTheLayout: a listing given a layout cache loads the
// program through it, leaving the kernel's layout there for the next,
// and lists the same with it as without.
func TestListKeepsTheLayout(t *testing.T) {
	if _, err := taskiter.Load(); err != nil {
		t.Skipf("task iterator not usable here: %v", err)
	}
	cache := filepath.Join(t.TempDir(), "layout")
	for i := range 2 {
		l, err := List(Options{Root: "/proc", Lister: ListBPF, LayoutCache: cache})
		if err != nil {
			t.Fatalf("listing %d: %v", i, err)
		}
		if !slices.Contains(l.PIDs, os.Getpid()) {
			t.Fatalf("listing %d does not hold this process", i)
		}
		st, err := os.Lstat(cache)
		if err != nil {
			t.Fatalf("after listing %d: %v", i, err)
		}
		if !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
			t.Errorf("after listing %d: the layout file is %v, want a regular file of mode 0600", i, st.Mode())
		}
	}
}

func TestExpectProcesses(t *testing.T) {
	n := expectProcesses()
	if n <= 0 || n > 1<<17 {
		t.Fatalf("expectProcesses() = %d", n)
	}
	l, err := List(Options{Root: "/proc", Lister: ListProc})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.PIDs) > n {
		t.Errorf("%d processes listed, more than the %d expected at most", len(l.PIDs), n)
	}
}

// TestListWalksAgainOnChurn: a pass whose census the host's changes
// spoiled is walked again, not confirmed against /proc, until one
// vouches; a host that keeps changing gets churnPasses walks, then the
// /proc confirmation.
func TestListWalksAgainOnChurn(t *testing.T) {
	p, err := taskiter.Load()
	if err != nil {
		t.Skipf("task iterator not usable here: %v", err)
	}
	defer p.Close()
	if !p.Walks() {
		t.Skip("the kernel has no open-coded task iterator: no walk to run again")
	}
	spoil := func(first int) func(*taskiter.Census) {
		n := 0
		return func(c *taskiter.Census) {
			if n++; n <= first {
				c.ForksBefore-- // a fork during the pass
			}
		}
	}
	for _, tt := range []struct {
		name    string
		spoiled int
		passes  int
		pending bool
	}{
		{"one pass spoiled", 1, 2, false},
		{"two spoiled", 2, 3, false},
		{"every pass spoiled", 100, churnPasses, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var l *Listing
			// Unspoiled passes may still see the host change: a few
			// tries for one whose count of passes is the test's.
			proc.WaitFor(t, 10*time.Second, "a listing whose own passes vouched as planned", func() bool {
				var err error
				l, err = List(Options{Root: "/proc", Lister: ListBPF, Program: p, Defer: true, churn: spoil(tt.spoiled)})
				if err != nil {
					t.Fatal(err)
				}
				return l.Passes == tt.passes && l.Pending() == tt.pending
			})
			if tt.pending && l.Unvouched != churned {
				t.Errorf("unvouched %q, want %q", l.Unvouched, churned)
			}
			if !slices.Contains(l.PIDs, os.Getpid()) {
				t.Error("this process is not listed")
			}
		})
	}
}
