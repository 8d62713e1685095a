package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"golang.org/x/sys/unix"
)

func findByPGID(rep Report, pgid int) *Tree {
	for i := range rep.Trees {
		if rep.Trees[i].PGID == pgid {
			return &rep.Trees[i]
		}
	}
	return nil
}

func alive(t *testing.T, ms []Member) int {
	t.Helper()
	n := 0
	for _, m := range ms {
		if fingerprint.Alive("/proc", fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks}) {
			n++
		}
	}
	return n
}

// TestRunRealTrees runs reconcile against real fake-kcserver trees with a
// liveness answer built by hand (the podman end-to-end tests cover the
// real answer).
func TestRunRealTrees(t *testing.T) {
	// A supervisor name of this test's own: Run with Apply must not reap the
	// fake trees of tests running in parallel in other packages.
	const comm = "kcsrv-reconcile"
	// IDs of this run's own: a tree left by another run of this test (or
	// running beside it) must not join its trees.
	gone, liveID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	stray := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: gone, Children: 1, Stubborn: true})
	kept := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: liveID, Children: 1})
	treesStarted := time.Now() // both trees run by now: each is at least this old
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// MinAge 0: no age rule (ages count in clock ticks: a tree scanned in
	// its first tick is 0 old).
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{gone: true, liveID: true}, KillGrace: 300 * time.Millisecond, Store: store}
	ctx := context.Background()

	t.Run("young trees are left alone", func(t *testing.T) {
		young := opt
		young.MinAge = time.Hour
		rep, err := Run(ctx, young, live)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, stray.PGID); tr == nil || tr.Action != action.SkipYoung {
			t.Fatalf("stray tree: %+v", tr)
		}
	})

	t.Run("a tree started after the death is not the dead one's", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			died time.Time
			want action.Action
		}{
			{"died before the tree started", time.Now().Add(-time.Hour), action.SkipYoung},
			{"died after the tree started", time.Time{}, action.WouldReap},
		} {
			t.Run(tc.name, func(t *testing.T) {
				o := opt
				o.DiedAt = tc.died
				if o.DiedAt.IsZero() {
					// A death well after the tree's start: ages count in
					// clock ticks and the doubt falls on sparing.
					for time.Since(treesStarted) < 100*time.Millisecond {
						time.Sleep(10 * time.Millisecond)
					}
					o.DiedAt = time.Now()
				}
				rep, err := Run(ctx, o, live)
				if err != nil {
					t.Fatal(err)
				}
				if tr := findByPGID(rep, stray.PGID); tr == nil || tr.Action != tc.want {
					t.Fatalf("stray tree: %+v, want %s", tr, tc.want)
				}
			})
		}
	})

	t.Run("a slow engine answer does not make an older tree look born after the death", func(t *testing.T) {
		for time.Since(treesStarted) < 100*time.Millisecond {
			time.Sleep(10 * time.Millisecond)
		}
		o := opt
		o.DiedAtByID = map[string]time.Time{cidGone: time.Now()}
		ran := time.Since(treesStarted) // at most, when the container died
		sc, err := Scan(o)
		if err != nil {
			t.Fatal(err)
		}
		// The engines answer long after the death: longer than the tree
		// had run when its container died.
		for time.Since(o.DiedAtByID[cidGone]) < 2*ran {
			time.Sleep(10 * time.Millisecond)
		}
		rep, err := sc.Run(ctx, live)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, stray.PGID); tr == nil || tr.Action != action.WouldReap {
			t.Fatalf("stray tree: %+v, want %s", tr, action.WouldReap)
		}
	})

	t.Run("a look writes no snapshot", func(t *testing.T) {
		if err := store.Update(liveID, func(r *ledger.Record) error { r.Trees = nil; return nil }); err != nil {
			t.Fatal(err)
		}
		look := opt
		look.Look = true
		if _, err := Run(ctx, look, live); err != nil {
			t.Fatal(err)
		}
		if rec, err := store.Load(liveID); err != nil || len(rec.Trees) != 0 {
			t.Errorf("live snapshot after a look: %+v, %v; want none written", rec, err)
		}
	})

	t.Run("dry run lists and kills nothing", func(t *testing.T) {
		rep, err := Run(ctx, opt, live)
		if err != nil {
			t.Fatal(err)
		}
		tr := findByPGID(rep, stray.PGID)
		if tr == nil || tr.Action != action.WouldReap || !rep.DryRun {
			t.Fatalf("stray tree: %+v", tr)
		}
		if n := alive(t, tr.Members); n != len(tr.Members) || n < 3 {
			t.Errorf("%d of %d members alive after a dry run", n, len(tr.Members))
		}
		if lt := findByPGID(rep, kept.PGID); lt == nil || lt.Action != action.SkipLive {
			t.Errorf("live tree: %+v", lt)
		}
		// The live container's snapshot was refreshed, dry run or not.
		rec, err := store.Load(liveID)
		if err != nil || len(rec.Trees) != 1 || rec.Trees[0].PGID != kept.PGID {
			t.Errorf("live snapshot: %+v, %v", rec, err)
		}
	})

	t.Run("the blast-radius guard reaps none of too many strays", func(t *testing.T) {
		cidGone2 := testutil.RandomHex(t, 64)
		other := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidGone2})
		guarded := opt
		guarded.Apply, guarded.MaxReap = true, 1
		guarded.Containers = map[string]bool{gone: true, cidGone2: true}
		rep, err := Run(ctx, guarded, live)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Refused == "" || !rep.Failed() {
			t.Fatalf("two strays over --max-reap 1 were not refused: %+v", rep)
		}
		// A dry run says so before --apply is switched on.
		guarded.Apply = false
		dry, err := Run(ctx, guarded, live)
		if err != nil {
			t.Fatal(err)
		}
		if dry.WouldRefuse == "" || dry.Refused != "" || dry.Failed() {
			t.Errorf("dry run of two strays over --max-reap 1: would refuse %q, refused %q, failed %v", dry.WouldRefuse, dry.Refused, dry.Failed())
		}
		for _, pgid := range []int{stray.PGID, other.PGID} {
			tr := findByPGID(rep, pgid)
			if tr == nil || tr.Action != action.WouldReap || alive(t, tr.Members) != len(tr.Members) {
				t.Errorf("tree %d under the guard: %+v", pgid, tr)
			}
		}
		other.Kill(t)
	})

	t.Run("apply reaps the stray, its socket, and only it", func(t *testing.T) {
		apply := opt
		apply.Apply = true
		rep, err := Run(ctx, apply, live)
		if err != nil {
			t.Fatal(err)
		}
		tr := findByPGID(rep, stray.PGID)
		if tr == nil || tr.Action != action.Reaped {
			t.Fatalf("stray tree: %+v", tr)
		}
		if n := alive(t, tr.Members); n != 0 {
			t.Errorf("%d members survived", n)
		}
		if _, err := os.Lstat(stray.Socket); !os.IsNotExist(err) {
			t.Errorf("stray socket still there: %v", err)
		}
		lt := findByPGID(rep, kept.PGID)
		if lt == nil || alive(t, lt.Members) != len(lt.Members) {
			t.Errorf("live container's tree was harmed: %+v", lt)
		}
		if _, err := os.Lstat(kept.Socket); err != nil {
			t.Errorf("live socket: %v", err)
		}
		rec, err := store.Load(gone)
		if err != nil || rec.Outcome != string(action.Reaped) {
			t.Errorf("ledger after apply: %+v, %v", rec, err)
		}
	})
}

// TestCollectKeepsRecordsWithLiveWrappers: a record whose supervise
// wrapper is still alive is kept, one whose processes are all dead goes.
func TestCollectKeepsRecordsWithLiveWrappers(t *testing.T) {
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	self, err := fingerprint.ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const withWrapper = "3333333333333333333333333333333333333333333333333333333333333333"
	const deadOnly = "4444444444444444444444444444444444444444444444444444444444444444"
	store.Update(withWrapper, func(r *ledger.Record) error {
		r.Supervisor = &ledger.Process{PID: self.PID, StartTicks: self.StartTicks}
		return nil
	})
	store.Update(deadOnly, func(r *ledger.Record) error {
		r.Supervisor = &ledger.Process{PID: self.PID, StartTicks: self.StartTicks + 1} // a recycled identity
		return nil
	})
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	opt := Options{Comms: []string{"kcsrv-collect"}, Containers: map[string]bool{withWrapper: true, deadOnly: true}, Store: store, Apply: true}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LedgerCollected != 1 {
		t.Errorf("collected %d records, want 1", rep.LedgerCollected)
	}
	if _, err := store.Load(withWrapper); err != nil {
		t.Errorf("record with a live wrapper was collected: %v", err)
	}
	if _, err := store.Load(deadOnly); err == nil {
		t.Error("record naming only dead processes was kept")
	}
}

// TestScanBeforeAsking: a tree that appears after the scan — its container
// may be younger than podman's answer — is not acted on by that run, even
// with no minimum age.
func TestScanBeforeAsking(t *testing.T) {
	const comm = "kcsrv-order"
	const cid = "5555555555555555555555555555555555555555555555555555555555555555"
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{cid: true}, Apply: true, KillGrace: 200 * time.Millisecond}
	sc, err := Scan(opt)
	if err != nil {
		t.Fatal(err)
	}
	late := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cid})
	rep, err := sc.Run(context.Background(), engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()})
	if err != nil {
		t.Fatal(err)
	}
	if tr := findByPGID(rep, late.PGID); tr != nil {
		t.Errorf("a tree born after the scan was acted on: %+v", tr)
	}
	self, err := fingerprint.ReadStat("/proc", late.PID)
	if err != nil || self.Zombie() {
		t.Errorf("the late tree's supervisor is gone: %v", err)
	}
}

func TestBlastRadius(t *testing.T) {
	exited := map[string]int{cidGone: 4242}
	trees := func(stray, other int) []Tree {
		var ts []Tree
		for range stray {
			ts = append(ts, Tree{Action: action.WouldReap})
		}
		for range other {
			ts = append(ts, Tree{Action: action.SkipLive})
		}
		return ts
	}
	// others are another user's groups, which no answer here vouches for.
	others := func(n int) []Tree {
		var ts []Tree
		for range n {
			ts = append(ts, Tree{UID: 1000, Action: action.SkipOtherUID})
		}
		return ts
	}
	// drained are the trees of a container whose init the kernel saw exit.
	drained := func(stray, other int) []Tree {
		ts := trees(stray, other)
		for i := range ts {
			ts[i].ContainerID = cidGone
		}
		return ts
	}
	scoped := map[string]bool{cidGone: true}
	for _, tt := range []struct {
		name    string
		max     int
		scope   map[string]bool
		ts      []Tree
		refused bool
	}{
		{"one stray alone", 50, nil, trees(1, 0), false},
		{"two of three", 50, nil, trees(2, 1), false},
		{"three of five", 50, nil, trees(3, 2), true},
		{"three of six", 50, nil, trees(3, 3), false},
		{"over max-reap", 5, nil, trees(6, 100), true},
		{"at max-reap", 6, nil, trees(6, 100), false},
		{"scoped: the ratio does not apply", 50, scoped, trees(10, 0), false},
		{"scoped: max-reap does", 5, scoped, trees(10, 0), true},
		{"guard disabled", 0, nil, trees(100, 0), false},
		{"a drain: the kernel saw every init exit", 50, scoped, drained(100, 0), false},
		{"a drain beside too many others", 5, scoped, append(drained(100, 0), trees(6, 0)...), true},
		{"a drain beside a few others", 5, scoped, append(drained(100, 0), trees(5, 0)...), false},
		// Anyone can start groups named kcserver: another user's do not
		// count among all trees.
		{"three of six, three another user's", 50, nil, append(trees(3, 0), others(3)...), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			why := blastRadius(Options{MaxReap: tt.max, Containers: tt.scope, InitExited: exited}, tt.ts, 0, engine.Set{UID: 0})
			if (why != "") != tt.refused {
				t.Errorf("refused %q, want refused=%v", why, tt.refused)
			}
		})
	}
}

// TestDryRunCollectsAfterRetention: a dry run removes the record of a
// container that is gone and whose processes are all dead once it is older
// than the retention, and never one whose container an engine lists as
// live or whose wrapper still runs.
func TestDryRunCollectsAfterRetention(t *testing.T) {
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	self, err := fingerprint.ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const withWrapper = "6666666666666666666666666666666666666666666666666666666666666666"
	const deadOnly = "7777777777777777777777777777777777777777777777777777777777777777"
	const liveContainer = "8888888888888888888888888888888888888888888888888888888888888888"
	store.Update(withWrapper, func(r *ledger.Record) error {
		r.Supervisor = &ledger.Process{PID: self.PID, StartTicks: self.StartTicks}
		return nil
	})
	for _, id := range []string{deadOnly, liveContainer} {
		store.Update(id, func(r *ledger.Record) error {
			r.Supervisor = &ledger.Process{PID: self.PID, StartTicks: self.StartTicks + 1} // a recycled identity
			return nil
		})
	}
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveContainer: true}, UID: os.Geteuid()}
	opt := Options{Comms: []string{"kcsrv-retain"}, Store: store, LedgerRetention: time.Hour,
		Containers: map[string]bool{withWrapper: true, deadOnly: true, liveContainer: true}}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LedgerCollected != 0 {
		t.Errorf("a dry run collected %d records younger than the retention", rep.LedgerCollected)
	}
	opt.LedgerRetention = time.Nanosecond
	if rep, err = Run(context.Background(), opt, live); err != nil {
		t.Fatal(err)
	}
	if rep.LedgerCollected != 1 {
		t.Errorf("collected %d records past the retention, want 1", rep.LedgerCollected)
	}
	if _, err := store.Load(deadOnly); err == nil {
		t.Error("the record of a gone container with only dead processes was kept past the retention")
	}
	for _, id := range []string{withWrapper, liveContainer} {
		if _, err := store.Load(id); err != nil {
			t.Errorf("record %s… collected by a dry run: %v", id[:4], err)
		}
	}
}

// TestCollectLeavesYoungRecordsUnlocked: a record the scan read as
// within the retention is kept without being locked and read again. A
// dry run used to lock every gone container's record of the week, each
// run; with a hook holding a stripe lock, it waited LockTimeout for it.
func TestCollectLeavesYoungRecordsUnlocked(t *testing.T) {
	dir := t.TempDir()
	store, err := ledger.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const gone = "9999999999999999999999999999999999999999999999999999999999999999"
	if err := store.Update(gone, func(r *ledger.Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A writer holding the whole ledger (an older kc-hook, stopped
	// mid-write) keeps every record's lock from being taken.
	f, err := os.OpenFile(filepath.Join(dir, "containers", ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	opt := Options{Comms: []string{"kcsrv-young"}, Store: store, LedgerRetention: time.Hour, Containers: map[string]bool{gone: true},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LedgerCollected != 0 {
		t.Errorf("a dry run collected %d records younger than the retention", rep.LedgerCollected)
	}
	if strings.Contains(logs.String(), "could not collect") {
		t.Errorf("a record within the retention was locked again:\n%s", logs.String())
	}
	if _, err := store.Load(gone); err != nil {
		t.Errorf("the young record is gone: %v", err)
	}
}

// TestBornAfter: a tree is a restarted container's when every member
// started at or after the tick before the death's, the death placed from
// the scan's end (100 ms before it here: the tick before is 11 ticks back).
func TestBornAfter(t *testing.T) {
	scanned := time.Now()
	sc := &Scanned{scanned: scanned, bootTicks: 100000}
	died := scanned.Add(-100 * time.Millisecond)
	tree := func(starts ...uint64) trees.Tree {
		tr := trees.Tree{AgeKnown: true}
		for i, s := range starts {
			tr.Members = append(tr.Members, fingerprint.Identity{Stat: fingerprint.Stat{PID: 100 + i, StartTicks: s}})
		}
		return tr
	}
	unknown := tree(99995)
	unknown.AgeKnown = false
	for _, tt := range []struct {
		name string
		t    trees.Tree
		died time.Time
		want bool
	}{
		{"started after the death", tree(99995, 99999), died, true},
		{"started in the death's tick", tree(99990), died, true},
		{"started the tick before", tree(99989), died, true},
		{"started before it", tree(99988), died, false},
		{"one member older than the death", tree(99999, 99900), died, false},
		{"no death", tree(99999), time.Time{}, false},
		{"ages unknown", unknown, died, false},
		{"a death after the scan", tree(99999), scanned.Add(time.Second), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := sc.bornAfter(tt.t, tt.died); got != tt.want {
				t.Errorf("bornAfter = %v, want %v (tick before the death %d)", got, tt.want, sc.tickBefore(tt.died))
			}
		})
	}
	// The boot clock unread: by the ages as of the scan's end.
	noClock := &Scanned{scanned: scanned}
	young, old := tree(99999), tree(99999)
	young.Oldest, old.Oldest = 50*time.Millisecond, 150*time.Millisecond
	if !noClock.bornAfter(young, died) || noClock.bornAfter(old, died) {
		t.Error("without the boot clock, a tree 50 ms old must be born after a death 100 ms ago, one 150 ms old not")
	}
}

// TestBornBeforeWithoutTheBootClock: unable to read the boot clock, a
// death's cgroup sweep withholds everything rather than nothing; a run
// on no death withholds nothing by age, as before.
func TestBornBeforeWithoutTheBootClock(t *testing.T) {
	id := strings.Repeat("ab", 32)
	died := &Scanned{scanned: time.Now(), opt: Options{DiedAtByID: map[string]time.Time{id: time.Now()}}}
	if got := died.bornBefore(id); got != 1 {
		t.Errorf("bornBefore with a death = %d, want 1", got)
	}
	if got := died.bornBefore(strings.Repeat("cd", 32)); got != 0 {
		t.Errorf("bornBefore of another container = %d, want 0", got)
	}
}

// TestWrongStoreCountsContainers: the wrong-store rule is about
// containers the engines do not list but that run here: two trees (or a
// tree and a cgroup) of one such container are one, a race; two such
// containers are not.
func TestWrongStoreCountsContainers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		trees map[string]string
		cgs   map[string]string
		wrong bool
	}{
		{"none", nil, nil, false},
		{"one container's tree", map[string]string{cidGone: "runs"}, nil, false},
		{"one container's tree and cgroup", map[string]string{cidGone: "runs"}, map[string]string{cidGone: "runs"}, false},
		{"two containers", map[string]string{cidGone: "runs", cidLive: "runs"}, nil, true},
		{"a tree and another's cgroup", map[string]string{cidGone: "runs"}, map[string]string{cidLive: "runs"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := wrongStore(tc.trees, tc.cgs)
			if (err != nil) != tc.wrong || (err != nil && !errors.Is(err, ErrWrongStore)) {
				t.Errorf("wrongStore = %v, want wrong %v", err, tc.wrong)
			}
		})
	}
}

// TestReapUnrecordedIsSaid: a reap whose outcome the ledger cannot take
// fails the run and says why in the report (JSON "unrecorded"), not only
// in the log.
func TestReapUnrecordedIsSaid(t *testing.T) {
	const comm = "kcsrv-unrecorded"
	gone := testutil.RandomHex(t, 64)
	stray := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: gone})
	state := t.TempDir()
	store, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{gone: true}, KillGrace: 300 * time.Millisecond, Store: store, Apply: true}
	sc, err := Scan(opt)
	if err != nil {
		t.Fatal(err)
	}
	// The ledger's directory becomes a file: no record can be written.
	dir := filepath.Join(state, "containers")
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := sc.Run(context.Background(), engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()})
	if err != nil {
		t.Fatal(err)
	}
	if tr := findByPGID(rep, stray.PGID); tr == nil || tr.Action != action.Reaped {
		t.Fatalf("stray: %+v, want reaped", tr)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Failed() || rep.UnrecordedText == "" || !strings.Contains(string(data), `"unrecorded":`) {
		t.Errorf("failed %v, JSON %s; want the run failed and why said", rep.Failed(), data)
	}
}

// TestSurvivorsOfAReapAreReported: a member that left its tree's group
// and would not die (a kernel's setsid child stuck in the kernel) is no
// tree any later scan finds; the record of its gone container names it,
// and each run reports it as would-not-die, unsignalled, until it is
// gone.
func TestSurvivorsOfAReapAreReported(t *testing.T) {
	survivor := exec.Command("sleep", "1000000")
	survivor.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := survivor.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { survivor.Process.Kill(); survivor.Wait() })
	st, err := fingerprint.ReadStat("/proc", survivor.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	gone := testutil.RandomHex(t, 64)
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(gone, func(r *ledger.Record) error {
		r.Trees = []ledger.Tree{{PGID: 4242, UID: os.Geteuid(), Action: action.WouldNotDie, Members: []ledger.Process{
			{PID: 4242, StartTicks: 1, Comm: "kcserver"},
			{PID: survivor.Process.Pid, StartTicks: st.StartTicks, Comm: "sleep", Escaped: true},
		}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	opt := Options{Comms: []string{"kcsrv-survivor"}, Containers: map[string]bool{gone: true}, Store: store, Apply: true, KillGrace: 100 * time.Millisecond}
	// An answer that is no ground truth for the tree's UID says nothing
	// of its container: nothing reported.
	other := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid() + 1000}
	if rep, err := Run(context.Background(), opt, other); err != nil || len(rep.Trees) != 0 {
		t.Fatalf("another UID's answer: %+v, %v; want nothing reported", rep, err)
	}
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Trees) != 1 || rep.Trees[0].Action != action.WouldNotDie || len(rep.Trees[0].Members) != 1 || rep.Trees[0].Members[0].PID != survivor.Process.Pid || !rep.Failed() {
		t.Fatalf("report %+v; want the survivor reported would-not-die and the run failed", rep)
	}
	if !fingerprint.Alive("/proc", st) {
		t.Error("the survivor was signalled")
	}
	// Gone, it is reported no more.
	survivor.Process.Kill()
	survivor.Wait()
	if rep, err := Run(context.Background(), opt, live); err != nil || len(rep.Trees) != 0 || rep.Failed() {
		t.Errorf("after its death: %+v, %v; want nothing reported", rep, err)
	}
}
