package reconcile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/contained"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
	"github.com/kc-watchman/kc-watchman/internal/trees"
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
		t.Fatalf("a gone container's group with another's ID on a member: %+v, want %s", tr, action.SkipAmbiguous)
	}
	tr := findByPGID(rep, kept.PGID)
	if tr == nil || tr.Action != action.SkipLive || tr.ContainerID != liveID || len(tr.Members) != 3 {
		t.Fatalf("a live container's tree: %+v, want %s with its 3 members", tr, action.SkipLive)
	}
	if n := alive(t, tr.Members); n != 3 {
		t.Errorf("%d of the live tree's members alive, want 3", n)
	}
}

// TestLiveAmbiguousGroupIsNotRecorded: a live container's group is read
// in full before its ledger snapshot is written. Recorded on its leader
// alone, a group with another container's ID on a member would be given
// to the live container, and a later run, its leader gone, would reap
// what the old code spared as ambiguous.
func TestLiveAmbiguousGroupIsNotRecorded(t *testing.T) {
	const comm = "kcsrv-partial"
	liveID, otherID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	mixed := testutil.StartMixedGroup(t, comm, liveID, otherID)
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{liveID: true, otherID: true}, Store: store}
	for run := 1; run <= 2; run++ {
		rep, err := Run(context.Background(), opt, live)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, mixed.PGID); tr == nil || tr.Action != action.SkipAmbiguous {
			t.Fatalf("run %d: the live container's ambiguous group: %+v, want %s", run, tr, action.SkipAmbiguous)
		}
		if r, err := store.Load(liveID); err == nil {
			for _, tr := range r.Trees {
				if tr.PGID == mixed.PGID {
					t.Fatalf("run %d: the ambiguous group was recorded as %s's: %+v", run, liveID[:12], tr)
				}
			}
		}
	}
}

// TestScopedRunCompletesOthersTrees: a run scoped to one container reads
// another container's group through its leader; if that container is
// not live, the members' argv are read after all, and a member carrying
// the wanted ID makes the group ambiguous — reported, never reaped.
func TestScopedRunCompletesOthersTrees(t *testing.T) {
	const comm = "kcsrv-partial"
	leaderID, memberID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	mixed := testutil.StartMixedGroup(t, comm, leaderID, memberID)
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{memberID: true}}
	for _, tc := range []struct {
		name       string
		leaderLive bool
		want       action.Action // "" for not reported
	}{
		{"the leader's container gone", false, action.SkipAmbiguous},
		// As an unscoped run: a live container's group is spared on its
		// leader's word.
		{"the leader's container live", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
			if tc.leaderLive {
				live.Live[leaderID] = true
			}
			rep, err := Run(context.Background(), opt, live)
			if err != nil {
				t.Fatal(err)
			}
			tr := findByPGID(rep, mixed.PGID)
			switch {
			case tc.want == "" && tr != nil:
				t.Errorf("reported %+v, want nothing", tr)
			case tc.want != "" && (tr == nil || tr.Action != tc.want):
				t.Errorf("got %+v, want %s", tr, tc.want)
			}
		})
	}
}

// TestCgroupSweepSparesALiveTreesMember: a process of a live container's
// group that carries a gone container's ID and sits in that container's
// kc-watchman cgroup is withheld when the cgroup is swept — as a left
// cgroup, and with the gone container's own stray tree (reap's sweep; a
// tree led by its supervisor, not by a wrapper, whose own teardown would
// sweep its cgroup by the member rules alone: only root moving a process
// into it puts another session's there).
// The member rules, which look at it alone, would take it (its UID, that
// container's ID); the scan, which judged its group on its leader, never
// saw it carry another ID.
func TestCgroupSweepSparesALiveTreesMember(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	const comm = "kcsrv-partial"
	for _, withTree := range []bool{false, true} {
		t.Run(fmt.Sprintf("stray tree %v", withTree), func(t *testing.T) {
			liveID, gone := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
			inGone := contained.Sleep(t, h, gone) // the gone container's own process
			var stray *testutil.MixedGroup
			if withTree {
				g := testutil.StartMixedGroup(t, comm, gone, gone) // one ID: a plain tree
				stray = &g
			}
			mixed := testutil.StartMixedGroup(t, comm, liveID, gone)
			procs := filepath.Join(h.Mount, contain.Dir, gone, "cgroup.procs")
			if err := os.WriteFile(procs, []byte(strconv.Itoa(mixed.Member)), 0); err != nil {
				t.Fatal(err)
			}
			live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
			// Scoped: an unscoped apply has no place on a shared test host.
			opt := Options{Comms: []string{comm}, Containers: map[string]bool{gone: true}, Apply: true, KillGrace: 300 * time.Millisecond}
			if withTree {
				// Recorded, as the wrapper records it: reap sweeps it
				// with the tree (an unrecorded one is the left-cgroup
				// pass's).
				store, err := ledger.Open(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Update(gone, func(r *ledger.Record) error {
					r.Cgroup = &ledger.Cgroup{Kind: string(contain.KindCgroup2), Path: contain.Dir + "/" + gone, UID: os.Geteuid()}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				opt.Store = store
			}
			rep, err := Run(context.Background(), opt, live)
			if err != nil {
				t.Fatal(err)
			}
			var swept *Cgroup
			for i := range rep.Cgroups {
				if rep.Cgroups[i].ContainerID == gone {
					swept = &rep.Cgroups[i]
				}
			}
			if swept == nil {
				t.Fatalf("the gone container's cgroup was not swept: %+v", rep.Cgroups)
			}
			if !running(mixed.Member) {
				t.Errorf("the live container's member %d in the gone container's cgroup was killed: %+v", mixed.Member, swept)
			}
			if running(inGone.Process.Pid) {
				t.Errorf("the gone container's own process %d lives on: %+v", inGone.Process.Pid, swept)
			}
			if stray != nil {
				if tr := findByPGID(rep, stray.PGID); tr == nil || tr.Action != action.Reaped {
					t.Errorf("the gone container's stray tree: %+v, want %s", tr, action.Reaped)
				}
			}
		})
	}
}

// TestVanishedPartialTreeKeepsItsCgroup: a tree the scan read through its
// leader and that is gone before the run could read it in full leaves its
// container's cgroup alone this run, as the decision about the tree would
// have: what the cgroup holds was never judged. Swept, the process in it
// would die on a decision nobody took.
func TestVanishedPartialTreeKeepsItsCgroup(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	const comm = "kcsrv-partial"
	gone := testutil.RandomHex(t, 64)
	inGone := contained.Sleep(t, h, gone)
	tree := testutil.StartMixedGroup(t, comm, gone, gone)
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{gone: true}, Apply: true, KillGrace: 300 * time.Millisecond}
	sc, err := Scan(opt)
	if err != nil {
		t.Fatal(err)
	}
	partial := false
	for _, tr := range sc.found {
		partial = partial || tr.PGID == tree.PGID && tr.Partial
	}
	if !partial {
		t.Fatalf("the scan did not read group %d through its leader: %+v", tree.PGID, sc.found)
	}
	// The tree dies between the scan and the run's full read.
	if err := syscall.Kill(-tree.PGID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for running(tree.PGID) || running(tree.Member) {
		if time.Now().After(deadline) {
			t.Fatal("the tree did not die")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rep, err := sc.Run(context.Background(), live)
	if err != nil {
		t.Fatal(err)
	}
	if tr := findByPGID(rep, tree.PGID); tr != nil {
		t.Errorf("the vanished tree was decided on: %+v", tr)
	}
	for _, c := range rep.Cgroups {
		if c.ContainerID == gone {
			t.Errorf("the vanished tree's cgroup was swept: %+v", c)
		}
	}
	if !running(inGone.Process.Pid) {
		t.Error("the process in the vanished tree's cgroup was killed")
	}
}

// TestTreeThatMovesBetweenScanAndFullRead: a live container's tree, read
// through its leader, is read in full because its ledger snapshot would
// change; its leader has exec'd meanwhile to name another container, one
// the answer (asked with the scan) may not know. The group is left for
// the next run, not judged as that container's stray.
func TestTreeThatMovesBetweenScanAndFullRead(t *testing.T) {
	const comm = "kcsrv-moved"
	liveID, newID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	pgid, moveTo := movingLeader(t, comm, liveID)
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{liveID: true, newID: true}, Store: store}
	sc := scanPartial(t, opt, pgid)
	moveTo(newID)
	rep, err := sc.Run(context.Background(), engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()})
	if err != nil {
		t.Fatal(err)
	}
	if tr := findByPGID(rep, pgid); tr != nil {
		t.Errorf("the group was decided on its full read: %+v", tr)
	}
	if !sc.vanished[liveID] || !sc.vanished[newID] {
		t.Errorf("vanished %v, want both containers' cgroups kept this run", sc.vanished)
	}
}

// movingLeader starts a group led by a shell named comm whose argv names
// id and whose child keeps the group from being a lone process; moveTo
// makes the leader exec to name another ID and waits until it has.
func movingLeader(t *testing.T, comm, id string) (pgid int, moveTo func(string)) {
	t.Helper()
	sh := filepath.Join(t.TempDir(), comm)
	if err := testutil.CopyFile("/bin/sh", sh, 0o755); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(t.TempDir(), "next")
	script := fmt.Sprintf(`trap 'exec %s -c "sleep 100000; :" "$(cat %s)"' USR1; sleep 100000 & wait`, sh, next)
	cmd := exec.Command(sh, "-c", script, id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid = cmd.Process.Pid
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // killed below
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL); <-done })
	argv := func() []string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pgid))
		return strings.Split(string(b), "\x00")
	}
	proc.WaitFor(t, 5*time.Second, "the leader and its child", func() bool {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pgid, pgid))
		return slices.Contains(argv(), id) && len(strings.TrimSpace(string(kids))) > 0
	})
	return pgid, func(newID string) {
		t.Helper()
		if err := os.WriteFile(next, []byte(newID), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pgid, syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		proc.WaitFor(t, 5*time.Second, "the leader to exec", func() bool { return slices.Contains(argv(), newID) })
	}
}

// scanPartial scans with opt and fails unless group pgid was read
// through its leader alone (a partial tree).
func scanPartial(t *testing.T, opt Options, pgid int) *Scanned {
	t.Helper()
	sc, err := Scan(opt)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sc.found, func(tr trees.Tree) bool { return tr.PGID == pgid && tr.Partial }) {
		t.Fatalf("the scan did not read group %d through its leader: %+v", pgid, sc.found)
	}
	return sc
}
