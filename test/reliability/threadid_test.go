//go:build reliability

package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const threadComm = "kcrel-thread"

// threadVariant says which recorded PIDs come back, and as what.
type threadVariant struct {
	name    string
	leader  bool // the supervisor's PID is taken
	member  bool // the kernel's PID is taken
	process bool // taken by a process (a recycled PID) instead of a thread
}

var threadVariants = []threadVariant{
	{name: "leader PID -> thread", leader: true},
	{name: "member PID -> thread", member: true},
	{name: "both PIDs -> threads", leader: true, member: true},
	{name: "leader PID -> process", leader: true, process: true},
}

type threadSummary struct {
	Trials        map[string]int
	Unplaced      int
	HookRuns      int
	ReconcileRuns int
	SweepRuns     int
	Innocents     int
	Signals       int
	TreesActedOn  int // trees reconcile or the hook found for the dead supervisor (must be 0)
	SocketsStale  int // its sockets judged stale: the supervisor is dead
	SocketsKept   int // judged live, or unknown for a thread ID (must be 0)
	// SocketsUnsure counts sockets of a PID recycled as a process within a
	// second of the socket's creation: gate 1 cannot tell the start times
	// apart within its slack, so the socket is kept ("unknown"). Keeping
	// is the safe side; a thread ID is never unsure.
	SocketsUnsure int
	Problems      []string
	Elapsed       time.Duration
}

// TestThreadIDCollision is posit-dev/positron#16167: a recorded supervisor
// (and kernel) die and their PIDs come back as thread IDs of an innocent
// process whose threads even carry the supervisor's comm — /proc/<tid>
// answers, kill(pid, 0) succeeds. kc-hook (poststop), kc-janitor reconcile
// --apply (with the ledger snapshot naming those PIDs) and kc-janitor
// sweep --apply must all treat the supervisor as dead: nothing is
// signalled, its orphan sockets are stale. Runs in a new PID namespace
// (ns_last_pid picks the thread IDs).
func TestThreadIDCollision(t *testing.T) {
	if inPIDNS() {
		threadHelper(t)
		return
	}
	var sum threadSummary
	runInPIDNS(t, "TestThreadIDCollision", 3*time.Minute, &sum)
	const area = "thread-id"
	total := 0
	for _, n := range sum.Trials {
		total += n
	}
	report(t, area, "trials", total)
	report(t, area, "trials_by_variant", sum.Trials)
	report(t, area, "hook_runs", sum.HookRuns)
	report(t, area, "reconcile_apply_runs", sum.ReconcileRuns)
	report(t, area, "sweep_apply_runs", sum.SweepRuns)
	report(t, area, "innocents_exposed", sum.Innocents)
	report(t, area, "signals_to_innocents", sum.Signals)
	report(t, area, "trees_found_for_dead_supervisor", sum.TreesActedOn)
	report(t, area, "sockets_judged_stale", sum.SocketsStale)
	report(t, area, "sockets_judged_live_or_unknown", sum.SocketsKept)
	report(t, area, "sockets_kept_recycled_within_slack", sum.SocketsUnsure)
	report(t, area, "elapsed_seconds", sum.Elapsed.Round(time.Millisecond).Seconds())
	if len(sum.Problems) > 0 {
		t.Errorf("%d problems:\n%v", len(sum.Problems), sum.Problems)
	}
	if sum.Signals != 0 || sum.TreesActedOn != 0 || sum.SocketsKept != 0 {
		t.Errorf("signals %d, trees acted on %d, sockets kept %d; want 0", sum.Signals, sum.TreesActedOn, sum.SocketsKept)
	}
	if total < 6*len(threadVariants) {
		t.Errorf("only %d trials", total)
	}
}

func threadHelper(t *testing.T) {
	proc.EnterPIDNamespace(t)
	start := time.Now()
	sum := threadSummary{Trials: map[string]int{}}
	podmanDir, setPS := listingPodman(t)
	state := t.TempDir()
	const perVariant = 6
	for i := 0; i < perVariant*len(threadVariants); i++ {
		v := threadVariants[i%len(threadVariants)]
		for attempt := 0; ; attempt++ {
			if attempt == 10 {
				t.Fatalf("%s: PIDs never placed", v.name)
			}
			if threadTrial(t, v, i%2 == 0, state, podmanDir, setPS, &sum) {
				sum.Trials[v.name]++
				break
			}
			sum.Unplaced++
		}
	}
	sum.Elapsed = time.Since(start)
	proc.WriteSummary(t, sum)
}

// threadTrial runs one collision; it returns false when the PIDs could not
// be placed (another task took them first).
func threadTrial(t *testing.T, v threadVariant, janitorFirst bool, state, podmanDir string, setPS func(map[string]string), sum *threadSummary) bool {
	problem := func(format string, args ...any) {
		sum.Problems = append(sum.Problems, v.name+": "+fmt.Sprintf(format, args...))
	}
	cid := newCID(t)
	sockDir, err := os.MkdirTemp("", "kcrel-th-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	env := baseEnv(podmanDir+":/usr/bin:/bin", "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+threadComm, "KC_KILL_GRACE=200ms")
	janitorArgs := append([]string{"reconcile", "--format", "json", "--min-age", "0s", "--kill-grace", "200ms", "--container", cid}, janitorGround()...)

	// 1. A live container (its createRuntime hook ran) with a tree: the
	// janitor's dry run records the tree's snapshot in the ledger, as it
	// does on every run.
	if r := runTool(t, hookBin(t), env, `{"id":"`+cid+`","status":"creating","bundle":"/nonexistent"}`, "createRuntime"); r.Code != 0 {
		t.Fatalf("createRuntime: exit %d: %s", r.Code, r.Stderr)
	}
	leader := startSupervisor(t, threadComm, cid, &syscall.SysProcAttr{Setpgid: true})
	member := startKernel(t, inGroup(leader.PID))
	setPS(map[string]string{cid: "running"})
	r := runTool(t, janitorBin(t), env, "", janitorArgs...)
	var rep reconcileJSON
	decodeJSON(t, r, &rep)
	if r.Code != 0 || rep.action(leader.PID) != "skipped-live" {
		t.Fatalf("dry run while live: exit %d, %+v, %s", r.Code, rep, r.Stderr)
	}
	store, err := ledger.OpenReadOnly(state)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(cid)
	if err != nil || len(rec.Trees) != 1 || len(rec.Trees[0].Members) != 2 {
		t.Fatalf("snapshot not recorded: %+v, %v", rec, err)
	}
	var socks []string
	if v.leader {
		socks = append(socks, orphanSocket(t, sockDir, "kc-"+strconv.Itoa(leader.PID)+".sock"))
	}
	if v.member {
		socks = append(socks, orphanSocket(t, sockDir, "kc-"+strconv.Itoa(member.PID)+".sock"))
	}

	// 2. The container stops; its supervisor tree dies without cleaning
	// up (SIGKILL, OOM).
	setPS(nil)
	var targets []*child
	if v.leader {
		targets = append(targets, leader)
	}
	if v.member {
		targets = append(targets, member)
	}
	inn := mustBystander(t, &syscall.SysProcAttr{Setpgid: true}, threadComm)
	defer inn.Close()
	maxStart := max(leader.Stat.StartTicks, member.Stat.StartTicks)
	leader.Kill()
	member.Kill()
	for _, c := range []*child{leader, member} {
		proc.WaitFor(t, 10*time.Second, fmt.Sprintf("pid %d gone", c.PID), func() bool { return !proc.Exists(procRoot, c.PID) })
	}
	if err := proc.WaitTickPast(procRoot, maxStart, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// 3. Their PIDs come back: threads of the innocent (named like the
	// supervisor), or a process.
	victims := []*bystander{inn}
	for _, c := range targets {
		if err := proc.SetNextPID(procRoot, c.PID); err != nil {
			t.Fatal(err)
		}
		if v.process {
			b, err := startBystander(&syscall.SysProcAttr{Setpgid: true}, threadComm)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			victims = append(victims, b)
			if b.PID != c.PID {
				return false
			}
			continue
		}
		if err := inn.NamedThreadAt(c.PID, threadComm); err != nil {
			return false
		}
		if tgid, err := proc.StatusField(procRoot, c.PID, "Tgid"); err != nil || tgid != strconv.Itoa(inn.PID) {
			t.Fatalf("pid %d is not a thread of %d: %q, %v", c.PID, inn.PID, tgid, err)
		}
		// kill(pid, 0) — the seeds' liveness test — says "alive".
		if err := syscall.Kill(c.PID, 0); err != nil {
			t.Fatalf("kill(%d, 0) = %v; the collision is not real", c.PID, err)
		}
	}
	sum.Innocents += len(victims)

	// 4. The hook and the janitor, in both orders (whichever runs first
	// sees the ledger snapshot naming the recycled PIDs).
	runHook := func() {
		sum.HookRuns++
		r := runTool(t, hookBin(t), env, hookState(cid), "poststop")
		if r.Code != 0 {
			problem("kc-hook poststop exit %d: %s", r.Code, r.Stderr)
		}
		rec, err := store.Load(cid)
		if err != nil {
			problem("no ledger record after poststop: %v", err)
			return
		}
		for _, tr := range rec.Trees {
			sum.TreesActedOn++
			problem("kc-hook recorded tree %+v", tr)
		}
	}
	runJanitor := func() {
		sum.ReconcileRuns++
		r := runTool(t, janitorBin(t), env, "", append(janitorArgs, "--apply")...)
		var rep reconcileJSON
		decodeJSON(t, r, &rep)
		if r.Code != 0 || !rep.LivenessKnown {
			problem("reconcile --apply exit %d: %s", r.Code, r.Stderr)
		}
		for _, tr := range rep.Trees {
			sum.TreesActedOn++
			problem("reconcile found tree %+v", tr)
		}
	}
	if janitorFirst {
		runJanitor()
		runHook()
	} else {
		runHook()
		runJanitor()
	}

	// 5. The sweep judges the sockets.
	sum.SweepRuns++
	r = runTool(t, janitorBin(t), env, "", "sweep", "--apply", "--format", "json", "--socket-dir", sockDir, "--timeout", "300ms")
	var sw sweepJSON
	decodeJSON(t, r, &sw)
	if r.Code != 0 || len(sw.Sockets) != len(socks) {
		problem("sweep exit %d, %d sockets, want %d: %s", r.Code, len(sw.Sockets), len(socks), r.Stdout)
	}
	for _, s := range sw.Sockets {
		if s.Verdict == "stale" && s.Action == "unlinked" {
			sum.SocketsStale++
			continue
		}
		if v.process && s.Verdict == "unknown" && s.Action == "kept" {
			sum.SocketsUnsure++
			continue
		}
		sum.SocketsKept++
		problem("socket %s: %s/%s: %s", filepath.Base(s.Path), s.Verdict, s.Action, s.Reason)
	}

	// 6. Nothing reached the innocents; their threads are intact.
	for _, b := range victims {
		if n, why := b.Harm(); n > 0 {
			sum.Signals += n
			problem("%s", why)
		}
	}
	if !v.process {
		for _, c := range targets {
			if tgid, err := proc.StatusField(procRoot, c.PID, "Tgid"); err != nil || tgid != strconv.Itoa(inn.PID) {
				sum.Signals++
				problem("thread %d of %d gone", c.PID, inn.PID)
			}
		}
	}
	return true
}
