package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/contained"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestSweepsCgroupsOfGoneContainers: a kc-watchman/<id> cgroup whose
// container is gone and which no ledger record names (a wrapper killed
// before its teardown) is reported by a dry run and swept by an apply
// run: what is in it killed, the cgroup removed. A live container's, one
// outside --container and a young one are left, with their processes.
func TestSweepsCgroupsOfGoneContainers(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	gone, empty, liveID, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	inGone := contained.Sleep(t, h, gone)
	contained.Sleep(t, h, empty).Process.Kill() //nolint:errcheck // an emptied cgroup
	inLive := contained.Sleep(t, h, liveID)
	inOther := contained.Sleep(t, h, other)
	gone2 := testutil.RandomHex(t, 64)
	inGone2 := contained.Sleep(t, h, gone2)
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{liveID: true}, UID: os.Geteuid()}
	scope := map[string]bool{gone: true, empty: true, liveID: true}
	ctx := context.Background()
	dir := func(id string) string { return filepath.Join(h.Mount, contain.Dir, id) }
	outcomes := func(rep Report) map[string]action.Action {
		m := map[string]action.Action{}
		for _, c := range rep.Cgroups {
			m[c.ContainerID] = c.Outcome
		}
		return m
	}

	t.Run("young cgroups are left alone", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: scope, MinAge: time.Hour, Apply: true}, live)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Cgroups) != 0 {
			t.Errorf("swept %+v, want nothing within MinAge", rep.Cgroups)
		}
	})
	t.Run("an engine that vouches for another UID only", func(t *testing.T) {
		rootless := live
		rootless.UID = 4321
		rep, err := Run(ctx, Options{Containers: scope, Apply: true}, rootless)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Cgroups) != 0 || !running(inGone.Process.Pid) || !isDir(dir(empty)) {
			t.Errorf("swept %+v with an answer that vouches for uid 4321 only", rep.Cgroups)
		}
	})
	// Evidence that a container runs: the ledger's init of it, alive.
	evidence := func(t *testing.T, ids ...string) *ledger.Store {
		st, err := fingerprint.ReadStat("/proc", inOther.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		store := recordedStore(t, ids[0], func(r *ledger.Record) {
			r.Init = &ledger.Process{PID: st.PID, StartTicks: st.StartTicks, Comm: st.Comm}
		})
		for _, id := range ids[1:] {
			if err := store.Update(id, func(r *ledger.Record) error {
				r.Init = &ledger.Process{PID: st.PID, StartTicks: st.StartTicks, Comm: st.Comm}
				r.Stages = map[string]time.Time{"createRuntime": time.Now()}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		return store
	}
	untouched := func(t *testing.T, rep Report) {
		t.Helper()
		for _, c := range rep.Cgroups {
			if c.Outcome != action.WouldReap {
				t.Errorf("cgroup of %s: %s", c.ContainerID[:12], c.Outcome)
			}
		}
		if !running(inGone.Process.Pid) || !running(inGone2.Process.Pid) || !isDir(dir(gone)) || !isDir(dir(gone2)) {
			t.Error("a populated cgroup was swept")
		}
	}
	t.Run("local evidence spares a populated cgroup", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: map[string]bool{gone: true, liveID: true}, Apply: true, Store: evidence(t, gone)}, live)
		if err != nil {
			t.Fatal(err)
		}
		if got := outcomes(rep); got[gone] != "" {
			t.Errorf("outcomes %v: the contradicted container's cgroup was not spared", got)
		}
		untouched(t, rep)
	})
	t.Run("two contradicted: the answer is the wrong one", func(t *testing.T) {
		both := map[string]bool{gone: true, gone2: true}
		rep, err := Run(ctx, Options{Containers: both, Apply: true, Store: evidence(t, gone, gone2)}, live)
		if !errors.Is(err, engine.ErrUnknown) {
			t.Errorf("err %v, want the ground truth unknown", err)
		}
		untouched(t, rep)
	})
	t.Run("more populated cgroups than --max-reap", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: map[string]bool{gone: true, gone2: true}, Apply: true, MaxReap: 1}, live)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Refused == "" {
			t.Error("not refused")
		}
		untouched(t, rep)
	})
	t.Run("dry run", func(t *testing.T) {
		rep, err := Run(ctx, Options{Containers: scope}, live)
		if err != nil {
			t.Fatal(err)
		}
		got := outcomes(rep)
		if got[gone] != action.WouldReap || got[empty] != action.WouldReap || len(got) != 2 {
			t.Errorf("outcomes %v, want would-reap for %s and %s only", got, gone[:12], empty[:12])
		}
		if !running(inGone.Process.Pid) || !isDir(dir(empty)) {
			t.Error("a dry run touched a cgroup")
		}
	})
	t.Run("apply", func(t *testing.T) {
		// --max-reap 1: the empty cgroup kills nothing and does not count.
		rep, err := Run(ctx, Options{Containers: scope, Apply: true, MaxReap: 1}, live)
		if err != nil {
			t.Fatal(err)
		}
		got := outcomes(rep)
		if got[gone] != action.Reaped || got[empty] != action.Gone || len(got) != 2 {
			t.Errorf("outcomes %v, want reaped for %s, gone for %s", got, gone[:12], empty[:12])
		}
		if isDir(dir(gone)) || isDir(dir(empty)) {
			t.Error("a swept cgroup is still there")
		}
		if running(inGone.Process.Pid) {
			t.Errorf("process %d in the gone container's cgroup lives on", inGone.Process.Pid)
		}
		for _, c := range []*exec.Cmd{inLive, inOther} {
			if !running(c.Process.Pid) {
				t.Errorf("process %d of a live or unscoped container's cgroup was killed", c.Process.Pid)
			}
		}
		if !isDir(dir(liveID)) || !isDir(dir(other)) {
			t.Error("a live or unscoped container's cgroup was removed")
		}
	})
}

func isDir(p string) bool {
	st, err := os.Lstat(p)
	return err == nil && st.IsDir()
}

// TestPopulatedCgroupsNeedACompleteListing: a populated cgroup of a gone
// container is swept only once its container has been checked for
// evidence of running, and that check needs the whole process table. When
// the iterator's listing cannot be completed against /proc, no populated
// cgroup is kept for sweeping (what it holds may be a live container's);
// with the listing completed, the same cgroup, without evidence, is.
func TestPopulatedCgroupsNeedACompleteListing(t *testing.T) {
	hidden := os.Getpid() // left out of the pass, so the census cannot vouch
	gone, empty := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	for _, tc := range []struct {
		name       string
		confirmErr error
		want       []string
	}{
		{"listing completed", nil, []string{gone, empty}},
		// The empty one after it goes too: the run stops looking.
		{"listing cannot be completed", errors.New("listing /proc: too many open files"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := proctable.List(proctable.Options{Lister: proctable.ListBPF, Defer: true, Hide: func(pid int) bool { return pid == hidden }})
			if taskiter.Unsupported(err) {
				t.Skipf("task iterator not usable here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !snap.Pending() {
				t.Fatal("a pass that left a process out is complete: nothing to confirm")
			}
			var buf strings.Builder
			sc := &Scanned{opt: Options{Root: fingerprint.DefaultRoot}, log: slog.New(slog.NewTextHandler(&buf, nil)), snap: snap}
			if tc.confirmErr != nil {
				sc.confirm = func() (int, error) { return 0, tc.confirmErr }
			}
			ls := []contain.Listed{{ContainerID: gone, Populated: true}, {ContainerID: empty}}
			kept, _ := sc.corroborateCgroups(ls, live)
			var got []string
			for _, l := range kept {
				got = append(got, l.ContainerID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("kept %v, want %v; log:\n%s", got, tc.want, buf.String())
			}
			// The evidence checker refuses a pending listing too; the
			// refusal must come before it is asked.
			if tc.confirmErr != nil && (!strings.Contains(buf.String(), "populated cgroups left alone") || sc.ck != nil) {
				t.Errorf("not refused before the evidence check:\n%s", buf.String())
			}
		})
	}
}

// TestDeathSweepSparesWhatStartedAfterIt: a death's engines are asked
// while the host is scanned, so their answer can predate a restart into
// the same kc-watchman/<id> cgroup. What started in a gone container's
// cgroup after its death is withheld (the restarted container's); what
// started before it is swept, though after another death of the burst.
func TestDeathSweepSparesWhatStartedAfterIt(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	before, after := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	afterDied := time.Now()
	waitTicks(t)
	old := contained.Sleep(t, h, before)
	waitTicks(t)
	beforeDied := time.Now()
	waitTicks(t)
	restarted := contained.Sleep(t, h, after)
	// Ticks after it, as a scan would be: what started in the scan's
	// own tick is withheld in any case.
	waitTicks(t)

	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	opt := Options{Containers: map[string]bool{before: true, after: true}, Apply: true,
		DiedAtByID: map[string]time.Time{before: beforeDied, after: afterDied}}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	if !running(restarted.Process.Pid) || !isDir(filepath.Join(h.Mount, contain.Dir, after)) {
		t.Errorf("cgroups %+v: what started after the death was swept", rep.Cgroups)
	}
	proc.WaitFor(t, 5*time.Second, "the process started before its container's death to die", func() bool { return !running(old.Process.Pid) })
}

// TestRecordedCgroupSweepIsJudgedByItsOwnDeath: two gone containers'
// stray trees, each recorded with its cgroup, are reaped in one run,
// and each cgroup's sweep (reap's, with the tree) withholds only what
// started after its own container's death: a's restart, started after
// a died, lives on; b's process, started after a's death but before b's,
// dies. One time for the whole run, whichever, gets one of them wrong.
func TestRecordedCgroupSweepIsJudgedByItsOwnDeath(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	const comm = "kcsrv-reborn"
	a, b := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b} {
		if err := store.Update(id, func(r *ledger.Record) error {
			r.Cgroup = &ledger.Cgroup{Kind: string(contain.KindCgroup2), Path: contain.Dir + "/" + id, UID: os.Geteuid()}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	treeA, treeB := testutil.StartMixedGroup(t, comm, a, a), testutil.StartMixedGroup(t, comm, b, b)
	oldA := contained.Sleep(t, h, a)
	waitTicks(t)
	aDied := time.Now()
	waitTicks(t)
	restartA := contained.Sleep(t, h, a)
	oldB := contained.Sleep(t, h, b)
	waitTicks(t)
	bDied := time.Now()
	waitTicks(t)

	live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	opt := Options{Comms: []string{comm}, Containers: map[string]bool{a: true, b: true}, Apply: true,
		KillGrace: 300 * time.Millisecond, Store: store, DiedAtByID: map[string]time.Time{a: aDied, b: bDied}}
	rep, err := Run(context.Background(), opt, live)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []testutil.MixedGroup{treeA, treeB} {
		if tr := findByPGID(rep, g.PGID); tr == nil || tr.Action != action.Reaped {
			t.Errorf("stray tree %d: %+v, want %s", g.PGID, tr, action.Reaped)
		}
	}
	if !running(restartA.Process.Pid) {
		t.Errorf("cgroups %+v: a's restart, started after a's death, was killed", rep.Cgroups)
	}
	for _, c := range []*exec.Cmd{oldA, oldB} {
		if running(c.Process.Pid) {
			t.Errorf("cgroups %+v: process %d, started before its container's death, lives on", rep.Cgroups, c.Process.Pid)
		}
	}
}

// waitTicks returns once /proc's clock is a few ticks on: what starts
// next starts ticks after what started before.
func waitTicks(t *testing.T) {
	t.Helper()
	from, err := proc.UptimeTicks("/proc")
	if err == nil {
		err = proc.WaitTickPast("/proc", from+2, 5*time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestDoubted: an answer asked while the host was scanned is doubted as
// soon as it leaves anything to act on — a tree or a kc-watchman cgroup,
// in scope, of a container it does not call live — and only then.
func TestDoubted(t *testing.T) {
	const comm = "kcsrv-doubted"
	h := contain.Detect(contain.Options{})
	withCgroup := h.Kind == contain.KindCgroup2
	treeID, cgID, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	testutil.StartMixedGroup(t, comm, treeID, treeID)
	if withCgroup {
		contained.Sleep(t, h, cgID)
	}
	liveSet := func(ids ...string) engine.Set {
		s := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
		for _, id := range ids {
			s.Live[id] = true
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		scope []string
		live  engine.Set
		want  bool
	}{
		{"the tree's container gone", []string{treeID}, liveSet(), true},
		{"the tree's container live", []string{treeID}, liveSet(treeID), false},
		{"the cgroup's container gone", []string{cgID}, liveSet(), true},
		{"both live", []string{treeID, cgID}, liveSet(treeID, cgID), false},
		{"outside --container", []string{other}, liveSet(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.scope[0] == cgID && !withCgroup {
				t.Skipf("containment here is %s (%s)", h, h.Why)
			}
			scope := map[string]bool{}
			for _, id := range tc.scope {
				scope[id] = true
			}
			sc, err := Scan(Options{Comms: []string{comm}, Containers: scope})
			if err != nil {
				t.Fatal(err)
			}
			if sc.opt.Contain.Mounts == nil {
				t.Error("the scan's cgroups do not share one mount table with its sweeps and reaps")
			}
			if got := sc.Doubted(tc.live); (len(got) > 0) != tc.want || len(got) > 0 && !slices.Equal(got, tc.scope[:1]) {
				t.Errorf("Doubted = %v, want %v (trees %+v, cgroups %+v)", got, tc.want, sc.found, sc.cgroups)
			}
		})
	}
}
