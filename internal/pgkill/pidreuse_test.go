package pgkill_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const (
	// TrialsEnv sets the number of PID reuse trials (default 200).
	trialsEnv = "KC_PIDREUSE_TRIALS"
)

// reuseSummary is what the helper reports to the parent test.
type reuseSummary struct {
	Trials  map[string]int // completed trials per scenario
	Retries map[string]int // placements that did not get the wanted PID
	// SignalsToInnocents counts every signal an innocent caught, plus one
	// for each innocent found dead, replaced or stopped.
	SignalsToInnocents int
	Elapsed            time.Duration
}

// TestPIDReuse forces the PIDs of a recorded, killed group onto innocent
// processes and threads, and checks that Kill on the stale record sends
// nothing to them. It needs root: it runs the trials as PID 1 of a new PID
// namespace, where /proc/sys/kernel/ns_last_pid picks the next PID.
func TestPIDReuse(t *testing.T) {
	if proc.InPIDNamespace() {
		pidReuseHelper(t)
		return
	}
	runReuseTrials(t, "TestPIDReuse", "PID reuse", 200, 30)
}

// runReuseTrials runs test (the calling test's name) as PID 1 of a new PID
// namespace with trials trials (short with -short; trialsEnv overrides both)
// and fails t unless every trial completed and no innocent got a signal.
func runReuseTrials(t *testing.T, test, what string, trials, short int) reuseSummary {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a new PID namespace and ns_last_pid")
	}
	if testing.Short() {
		trials = short
	}
	if v := os.Getenv(trialsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", trialsEnv, v)
		}
		trials = n
	}
	var sum reuseSummary
	proc.RunInPIDNamespace(t, test, 3*time.Minute, &sum, trialsEnv+"="+strconv.Itoa(trials))
	total := 0
	for _, n := range sum.Trials {
		total += n
	}
	t.Logf("%s: %d trials in %v, per scenario %v; retried placements %v; signals to innocents: %d",
		what, total, sum.Elapsed.Round(time.Millisecond), sum.Trials, sum.Retries, sum.SignalsToInnocents)
	if total != trials {
		t.Errorf("%d trials completed, want %d", total, trials)
	}
	if sum.SignalsToInnocents != 0 {
		t.Errorf("%d signals reached innocent processes", sum.SignalsToInnocents)
	}
	return sum
}

// reuseScenario says which recorded PID the innocent takes over, and how.
type reuseScenario struct {
	name string
	// target: "leader", "member" or "both" recorded PIDs.
	target string
	// thread: the PID comes back as a thread ID of an innocent process.
	thread bool
	// ownGroup: the innocent taking the leader's PID leads its own group,
	// so it owns the recorded PGID as well.
	ownGroup bool
}

var reuseScenarios = []reuseScenario{
	{name: "leader-pid/owns-pgid", target: "leader", ownGroup: true},
	{name: "leader-pid/other-group", target: "leader"},
	{name: "member-pid", target: "member", ownGroup: true},
	{name: "both-pids/one-group", target: "both", ownGroup: true},
	{name: "thread-at-leader-pid", target: "leader", thread: true},
	{name: "thread-at-member-pid", target: "member", thread: true},
}

// errRetry means the innocent did not get the wanted PID (another task
// took it first); the trial is run again.
var errRetry = errors.New("wanted pid not obtained")

// pidReuseHelper runs as PID 1 of a new PID and mount namespace.
func pidReuseHelper(t *testing.T) {
	runHelperTrials(t, len(reuseScenarios), func(i int) (string, int, error) {
		sc := reuseScenarios[i]
		signals, err := reuseTrial(t, sc)
		return sc.name, signals, err
	})
}

// runHelperTrials runs, as PID 1 of a new PID and mount namespace, the
// number of trials trialsEnv asks for over scenarios 0…scenarios-1 in
// turn, retrying a trial whose wanted PID another task took (errRetry), and
// hands the summary back (proc.WriteSummary). trial runs scenario i and returns its
// name and the signals innocents got.
func runHelperTrials(t *testing.T, scenarios int, trial func(i int) (name string, signals int, err error)) {
	proc.EnterPIDNamespace(t)
	trials, err := strconv.Atoi(os.Getenv(trialsEnv))
	if err != nil {
		t.Fatalf("%s: %v", trialsEnv, err)
	}
	sum := reuseSummary{Trials: map[string]int{}, Retries: map[string]int{}}
	start := time.Now()
	for i := range trials {
		for attempt := 0; ; attempt++ {
			name, signals, err := trial(i % scenarios)
			if errors.Is(err, errRetry) {
				sum.Retries[name]++
				if attempt >= 50 {
					t.Fatalf("%s: wanted PID never obtained in %d attempts", name, attempt+1)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: trial %d: %v", name, i, err)
			}
			sum.SignalsToInnocents += signals
			sum.Trials[name]++
			break
		}
	}
	sum.Elapsed = time.Since(start)
	proc.WriteSummary(t, sum)
}

// reuseTrial records a group (leader + member), kills and reaps it, hands
// the recorded PID(s) to innocents, runs Kill on the stale record and
// returns the number of signals that reached the innocents.
func reuseTrial(t *testing.T, sc reuseScenario) (int, error) {
	var cleanup []func()
	defer func() {
		for _, f := range slices.Backward(cleanup) {
			f()
		}
	}()
	start := func(cmd *exec.Cmd) error {
		if err := cmd.Start(); err != nil {
			return err
		}
		cleanup = append(cleanup, func() { proc.Reap(cmd) })
		return nil
	}

	// 1. The recorded group.
	leader, member := sleepCmd(), sleepCmd()
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := start(leader); err != nil {
		return 0, err
	}
	member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: leader.Process.Pid}
	if err := start(member); err != nil {
		return 0, err
	}
	g := pgkill.Group{PGID: leader.Process.Pid}
	for _, cmd := range []*exec.Cmd{leader, member} {
		st, err := fingerprint.ReadStat(root, cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		if st.PGID != g.PGID {
			return 0, fmt.Errorf("pid %d in group %d, want %d", st.PID, st.PGID, g.PGID)
		}
		g.Members = append(g.Members, st)
	}
	recLeader, recMember := g.Members[0], g.Members[1]

	// 2. Kill and reap it; its PIDs are free again.
	proc.Reap(leader)
	proc.Reap(member)
	for _, st := range g.Members {
		if !proc.Poll(waitLong, func() bool { return !proc.Exists(root, st.PID) }) {
			return 0, fmt.Errorf("pid %d still in /proc after reaping", st.PID)
		}
	}
	// 3. Let the clock pass the recorded start times: a PID reused within
	// the same tick would be indistinguishable (a documented limit).
	if err := proc.WaitTickPast(root, max(recLeader.StartTicks, recMember.StartTicks), waitLong); err != nil {
		return 0, err
	}

	// 4. Hand the recorded PIDs to innocents.
	type victim struct {
		inn *proc.Innocent
		st  fingerprint.Stat // its identity before Kill
		at  fingerprint.Stat // the recorded identity whose PID it took over
	}
	var victims []victim
	place := func(n int, attr *syscall.SysProcAttr) (*proc.Innocent, error) {
		if err := proc.SetNextPID(root, n); err != nil {
			return nil, err
		}
		inn, err := proc.StartInnocent(attr)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, inn.Close)
		if inn.PID != n {
			return nil, errRetry
		}
		return inn, nil
	}
	targets := map[string][]fingerprint.Stat{
		"leader": {recLeader},
		"member": {recMember},
		"both":   {recMember, recLeader},
	}[sc.target]

	switch {
	case sc.thread:
		inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
		if err != nil {
			return 0, err
		}
		cleanup = append(cleanup, inn.Close)
		for _, rec := range targets {
			if err := proc.SetNextPID(root, rec.PID); err != nil {
				return 0, err
			}
			if err := inn.ThreadAt(rec.PID); err != nil {
				return 0, errRetry
			}
			victims = append(victims, victim{inn: inn, at: rec})
		}
	case sc.target == "both":
		// The member's PID first (a Go innocent's own threads would take
		// the number after the leader's), then the leader's, leading the
		// recorded PGID; then the first joins that group.
		m, err := place(recMember.PID, nil)
		if err != nil {
			return 0, err
		}
		l, err := place(recLeader.PID, &syscall.SysProcAttr{Setpgid: true})
		if err != nil {
			return 0, err
		}
		if err := m.Setpgid(recLeader.PID); err != nil {
			return 0, err
		}
		victims = append(victims, victim{inn: m, at: recMember}, victim{inn: l, at: recLeader})
	default:
		inn, err := place(targets[0].PID, &syscall.SysProcAttr{Setpgid: sc.ownGroup})
		if err != nil {
			return 0, err
		}
		victims = append(victims, victim{inn: inn, at: targets[0]})
	}

	// 5. Check the takeover is real: the recorded PID answers in /proc
	// for an innocent, with another start time.
	for i := range victims {
		v := &victims[i]
		st, err := fingerprint.ReadStat(root, v.inn.PID)
		if err != nil {
			return 0, err
		}
		v.st = st
		now, err := fingerprint.ReadStat(root, v.at.PID)
		if err != nil {
			return 0, fmt.Errorf("recorded pid %d not taken over: %w", v.at.PID, err)
		}
		if now.StartTicks == v.at.StartTicks {
			return 0, fmt.Errorf("pid %d reused within its recorded start tick %d", v.at.PID, now.StartTicks)
		}
		tgid, err := proc.StatusField(root, v.at.PID, "Tgid")
		if err != nil {
			return 0, err
		}
		if tgid != strconv.Itoa(v.inn.PID) || (sc.thread == (v.at.PID == v.inn.PID)) {
			return 0, fmt.Errorf("pid %d: Tgid %s, innocent %d, thread scenario %v", v.at.PID, tgid, v.inn.PID, sc.thread)
		}
		if sc.ownGroup && sc.target != "member" && st.PGID != g.PGID {
			return 0, fmt.Errorf("innocent %d in group %d, want the recorded %d", v.inn.PID, st.PGID, g.PGID)
		}
	}

	// 6. Kill on the stale record must find no original member and send
	// nothing.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	res := pgkill.Kill(ctx, g, pgkill.Options{Root: root, Grace: 100 * time.Millisecond, Poll: 5 * time.Millisecond, KillWait: time.Second})
	if res.Outcome != action.Gone || len(res.Signals) != 0 || res.Err != nil {
		t.Errorf("%s: Kill on a stale record = %+v; want gone, no signal", sc.name, res)
	}

	// 7. Count what reached the innocents.
	signals := 0
	for _, v := range victims {
		n, present := harmed(t, sc.name, v.inn, v.st)
		signals += n
		if !present {
			continue
		}
		if sc.thread {
			if tgid, err := proc.StatusField(root, v.at.PID, "Tgid"); err != nil || tgid != strconv.Itoa(v.inn.PID) {
				t.Errorf("%s: thread %d of innocent %d gone (%q, %v)", sc.name, v.at.PID, v.inn.PID, tgid, err)
			}
		}
	}
	return signals, nil
}

// harmed counts what reached an innocent process during a trial: it is no
// longer the same live process, it is stopped, or it caught signals. Each
// harm is also an error on t. present is false when the innocent is gone
// or replaced, and nothing more can be asked of it.
func harmed(t *testing.T, name string, inn *proc.Innocent, before fingerprint.Stat) (harms int, present bool) {
	t.Helper()
	now, err := fingerprint.ReadStat(root, inn.PID)
	switch {
	case err != nil || !fingerprint.Same(now, before) || !fingerprint.Alive(root, before):
		t.Errorf("%s: innocent %d gone or replaced: %+v, %v", name, inn.PID, now, err)
		return 1, false
	case now.State == 'T' || now.State == 't':
		t.Errorf("%s: innocent %d stopped", name, inn.PID)
		harms++
	}
	n, err := inn.Sync()
	if err != nil {
		t.Errorf("%s: innocent %d: %v", name, inn.PID, err)
		harms++
	}
	if n != 0 {
		t.Errorf("%s: innocent %d caught %v", name, inn.PID, inn.Caught())
	}
	return harms + n, true
}
