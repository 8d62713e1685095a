//go:build reliability

package reliability

import (
	"context"
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
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

const (
	raceComm      = "kcrel-race"
	raceTrialsEnv = "KC_REL_RACE_TRIALS"
)

// raceKind is what happens to the recorded group at the race point.
type raceKind int

const (
	kindNone         raceKind = iota
	kindMember                // a non-leader member dies; an innocent process takes its PID
	kindMemberThread          // a non-leader member dies; its PID becomes a thread of an innocent
	kindLeaderGroup           // the whole group dies; an innocent group takes the leader's PID and PGID (and a member's PID)
	kindLeaderThread          // the whole group dies; the leader's PID becomes a thread of an innocent
	kindEscape                // a member leaves the group, the rest die; an innocent group takes the PGID
)

var raceKinds = []raceKind{kindMember, kindMemberThread, kindLeaderGroup, kindLeaderThread, kindEscape}

func (k raceKind) String() string {
	return [...]string{
		"none",
		"member PID -> innocent process",
		"member PID -> innocent thread",
		"leader PID+PGID -> innocent group",
		"leader PID -> innocent thread",
		"member escapes, PGID -> innocent group",
	}[k]
}

// raceSummary is what the helper in the PID namespace reports.
type raceSummary struct {
	Trials       int            // trials whose race was staged
	Unplaced     int            // trials whose race point lay past the end of Kill, or whose PID placement failed
	ByPoint      map[string]int // staged trials per race point
	ByKind       map[string]int // staged trials per kind
	ByCell       map[string]int // kind | point
	Outcomes     map[string]int // pgkill outcomes of staged trials
	Innocents    int            // innocent processes and threads exposed
	Signals      int            // signals that reached an innocent (or an escaped member)
	Harms        []string
	Leftover     int // recorded members Kill left alive in the recorded group
	Retries      int // PID placements retried
	Calibration  int // identity reads of an undisturbed Kill
	IdentityRead int // identity reads served in all trials
	Elapsed      time.Duration
}

// TestPIDReuseRace is the misdirected-signal trial: in a new
// PID namespace, a supervisor tree found by trees.Scan is killed with
// pgkill.Kill exactly as kc-hook and kc-janitor kill it, while the test
// makes a recorded member die and hands its PID — or the whole group's
// PGID — to innocent processes or threads at every point where the race
// can fall: after the scan, at each identity re-read pgkill makes before
// SIGTERM (pinned member running, then frozen), during the grace, when
// the grace is over, at each re-read before SIGKILL, and after SIGKILL.
// Every signal an innocent catches is counted; the number must be 0.
func TestPIDReuseRace(t *testing.T) {
	if inPIDNS() {
		pidRaceHelper(t)
		return
	}
	trials := 240
	if v := os.Getenv(raceTrialsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", raceTrialsEnv, v)
		}
		trials = n
	}
	var sum raceSummary
	runInPIDNS(t, "TestPIDReuseRace", 4*time.Minute, &sum, raceTrialsEnv+"="+strconv.Itoa(trials))

	const area = "pid-reuse"
	report(t, area, "trials", sum.Trials)
	report(t, area, "trials_by_race_point", sum.ByPoint)
	report(t, area, "trials_by_kind", sum.ByKind)
	report(t, area, "cells_covered", len(sum.ByCell))
	report(t, area, "kill_outcomes", sum.Outcomes)
	report(t, area, "identity_reads_per_kill", sum.Calibration)
	report(t, area, "race_points_served", sum.IdentityRead)
	report(t, area, "innocents_exposed", sum.Innocents)
	report(t, area, "signals_to_innocents", sum.Signals)
	report(t, area, "members_left_alive_in_group", sum.Leftover)
	report(t, area, "unplaced_trials", sum.Unplaced)
	report(t, area, "elapsed_seconds", sum.Elapsed.Round(time.Millisecond).Seconds())
	if sum.Trials < trials {
		t.Errorf("%d trials staged, want %d", sum.Trials, trials)
	}
	if sum.Signals != 0 {
		t.Errorf("%d signals reached innocents: %v", sum.Signals, sum.Harms)
	}
	if sum.Leftover != 0 {
		t.Errorf("%d recorded members were left alive in their group", sum.Leftover)
	}
	for _, k := range raceKinds {
		if sum.ByKind[k.String()] == 0 {
			t.Errorf("kind %q never staged", k)
		}
	}
	for _, p := range []string{pointAfterScan, pointBeforeTerm, pointTermFrozen, pointGrace, pointGraceOver, pointKillFrozen, pointAfterKill} {
		if sum.ByPoint[p] == 0 {
			t.Errorf("race point %q never reached", p)
		}
	}
}

// Race points, in the order Kill passes them.
const (
	pointAfterScan  = "1 after the scan, before Kill"
	pointBeforeTerm = "2 before SIGTERM (member pinned, running)"
	pointTermFrozen = "3 before SIGTERM (member pinned and frozen)"
	pointGrace      = "4 between SIGTERM and SIGKILL (grace)"
	pointGraceOver  = "5 grace over, before SIGKILL"
	pointKillFrozen = "6 before SIGKILL (member pinned and frozen)"
	pointAfterKill  = "7 after SIGKILL"
)

func pidRaceHelper(t *testing.T) {
	proc.EnterPIDNamespace(t)
	trials, err := strconv.Atoi(os.Getenv(raceTrialsEnv))
	if err != nil {
		t.Fatal(err)
	}
	sum := raceSummary{ByPoint: map[string]int{}, ByKind: map[string]int{}, ByCell: map[string]int{}, Outcomes: map[string]int{}}
	start := time.Now()

	cal := raceTrial(t, kindNone, -1)
	sum.Calibration = cal.reads
	if cal.reads < 6 {
		t.Fatalf("an undisturbed Kill made %d identity reads through its Root; the race interposer no longer sees pgkill's reads", cal.reads)
	}
	if cal.outcome != action.Reaped || cal.leftover != 0 {
		t.Fatalf("undisturbed Kill: %s, %d left alive", cal.outcome, cal.leftover)
	}
	points := cal.reads + 2 // race point 0 is "before Kill"; reads vary a little between runs

	for i := 0; sum.Trials < trials; i++ {
		if i > 3*trials {
			t.Fatalf("only %d of %d trials staged after %d attempts", sum.Trials, trials, i)
		}
		kind := raceKinds[i%len(raceKinds)]
		point := (i / len(raceKinds)) % (points + 1)
		r := raceTrial(t, kind, point)
		sum.Retries += r.retries
		sum.IdentityRead += r.reads
		sum.Innocents += r.innocents
		sum.Signals += r.signals
		sum.Harms = append(sum.Harms, r.harms...)
		sum.Leftover += r.leftover
		if !r.staged {
			sum.Unplaced++
			continue
		}
		sum.Trials++
		sum.ByPoint[r.label]++
		sum.ByKind[r.kind.String()]++
		sum.ByCell[r.kind.String()+" | "+r.label]++
		sum.Outcomes[string(r.outcome)]++
	}
	sum.Elapsed = time.Since(start)
	proc.WriteSummary(t, sum)
}

// raceResult is the outcome of one trial.
type raceResult struct {
	kind      raceKind // what was actually staged (an escape falls back to leader-group when the member is frozen)
	staged    bool
	label     string
	reads     int
	outcome   action.Action
	innocents int
	signals   int
	harms     []string
	leftover  int
	retries   int
}

// race is one trial in progress.
type race struct {
	t        *testing.T
	kind     raceKind
	point    int
	cid      string
	leader   *child
	member   *child
	stubborn *bystander // ignores SIGTERM: the group outlives the grace
	recorded []fingerprint.Stat
	pgid     int

	cancel    context.CancelFunc
	cancelled bool
	termAt    int
	reads     int
	res       raceResult

	innocents    []*bystander
	threads      map[int]*bystander // recorded PID -> innocent holding it as a thread
	escaped      bool
	escapeCaught int
	err          error // a failure while staging (on a gate goroutine)
}

// scanTree scans for the trial's tree as the hook and the janitor do.
func (r *race) scanTree() *trees.Tree {
	found, _, err := trees.Scan(trees.Options{Root: procRoot, Comms: []string{raceComm}})
	if err != nil {
		r.t.Fatal(err)
	}
	for i := range found {
		if found[i].PGID == r.pgid {
			return &found[i]
		}
	}
	return nil
}

func raceTrial(t *testing.T, kind raceKind, point int) raceResult {
	r := &race{t: t, kind: kind, point: point, cid: newCID(t), threads: map[int]*bystander{}}
	r.res.kind = kind
	defer r.cleanup()

	// The tree: a supervisor leading its group, a kernel, and a member
	// that survives SIGTERM.
	var err error
	r.leader, err = startChild(supervisorBin(t, raceComm), []string{"--container-id=" + r.cid, "1000000"}, &syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	r.pgid = r.leader.PID
	sleep, _ := exec.LookPath("sleep")
	if r.member, err = startChild(sleep, []string{"sleep", "1000000"}, inGroup(r.pgid)); err != nil {
		t.Fatal(err)
	}
	if r.stubborn, err = startBystander(inGroup(r.pgid), ""); err != nil {
		t.Fatal(err)
	}

	// Found as the hook and the janitor find it. Polled: under load a
	// member just started may not be visible in /proc with its final comm
	// and group yet; the tree must still be found whole before the trial.
	var tree *trees.Tree
	for deadline := time.Now().Add(10 * time.Second); ; {
		tree = r.scanTree()
		if tree != nil && tree.ContainerID == r.cid && tree.Signalable() && len(tree.Members) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scan did not find the tree of %d as expected within 10s: %+v", r.pgid, tree)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.recorded = tree.Stats()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.cancel = cancel
	gp := newGatedProc(t, r.recorded, r.onRead)
	defer gp.close()

	if point == 0 {
		r.res.label = pointAfterScan
		r.stage()
	}
	done := make(chan pgkill.Result, 1)
	go func() {
		done <- pgkill.Kill(ctx, pgkill.Group{PGID: r.pgid, Members: r.recorded},
			pgkill.Options{Root: gp.root, Grace: time.Hour, Poll: 2 * time.Millisecond, KillWait: 10 * time.Second})
	}()
	select {
	case res := <-done:
		r.res.outcome = res.Outcome
	case <-time.After(time.Minute):
		t.Fatalf("Kill did not return (kind %s, point %d, %d reads)", kind, point, r.reads)
	}
	r.res.reads = r.reads
	if r.err != nil {
		t.Fatalf("staging %s at %q: %v", kind, r.res.label, r.err)
	}

	// Kill must not have left a recorded member alive in the group.
	for _, m := range r.recorded {
		st, err := fingerprint.Revalidate(procRoot, m)
		if err == nil && !st.Zombie() && st.PGID == r.pgid {
			r.res.leftover++
			r.res.harms = append(r.res.harms, fmt.Sprintf("%s at %q: recorded member %d still alive in group %d", kind, r.res.label, m.PID, r.pgid))
		}
	}
	// Count what reached the innocents.
	for _, b := range r.innocents {
		r.res.innocents++
		if n, why := b.Harm(); n > 0 {
			r.res.signals += n
			r.res.harms = append(r.res.harms, fmt.Sprintf("%s at %q: %s", kind, r.res.label, why))
		}
	}
	for pid, b := range r.threads {
		if tgid, err := proc.StatusField(procRoot, pid, "Tgid"); err != nil || tgid != strconv.Itoa(b.PID) {
			r.res.signals++
			r.res.harms = append(r.res.harms, fmt.Sprintf("%s at %q: thread %d of innocent %d gone (%q, %v)", kind, r.res.label, pid, b.PID, tgid, err))
		}
	}
	if r.escaped {
		// Once out of the group, the member must hear nothing more.
		n, err := r.stubborn.Sync()
		switch {
		case r.stubborn.Dead() || stopping(r.stubborn.PID) || err != nil:
			r.res.signals++
			r.res.harms = append(r.res.harms, fmt.Sprintf("%s at %q: escaped member %d dead, stopped or mute (%v)", kind, r.res.label, r.stubborn.PID, err))
		case n > r.escapeCaught:
			r.res.signals += n - r.escapeCaught
			r.res.harms = append(r.res.harms, fmt.Sprintf("%s at %q: escaped member %d caught %v", kind, r.res.label, r.stubborn.PID, r.stubborn.Caught()[r.escapeCaught:]))
		}
	}
	return r.res
}

func (r *race) cleanup() {
	for _, b := range r.innocents {
		b.Close()
	}
	if r.stubborn != nil {
		r.stubborn.Close()
	}
	r.member.Kill()
	r.leader.Kill()
}

// onRead runs before each identity read pgkill makes of a recorded
// member; Kill is blocked in that read meanwhile.
func (r *race) onRead(int) {
	r.reads++
	if r.reads == r.point {
		r.res.label = r.phase()
		r.stage()
	}
	// End the grace a few reads after SIGTERM went out.
	if !r.cancelled {
		if r.termAt == 0 && r.termSent() {
			r.termAt = r.reads
		}
		if (r.termAt > 0 && r.reads >= r.termAt+3) || r.reads >= 60 {
			r.cancel()
			r.cancelled = true
		}
	}
}

// termSent: the stubborn member caught or holds a pending SIGTERM, or the
// leader (which only SIGTERM kills) is dead.
func (r *race) termSent() bool {
	if slices.Contains(r.stubborn.Caught(), "SIGTERM") || !fingerprint.Alive(procRoot, r.leader.Stat) {
		return true
	}
	for _, key := range []string{"ShdPnd", "SigPnd"} {
		if m, err := proc.SignalMask(procRoot, r.stubborn.PID, key); err == nil && proc.HasSignal(m, syscall.SIGTERM) {
			return true
		}
	}
	return false
}

// phase names where Kill stands, from what can be observed.
func (r *race) phase() string {
	stopped := len(stoppedOf(r.recorded)) > 0
	switch {
	case r.cancelled && !fingerprint.Alive(procRoot, r.stubborn.Stat):
		return pointAfterKill
	case r.cancelled && stopped:
		return pointKillFrozen
	case r.cancelled:
		return pointGraceOver
	case r.termSent():
		return pointGrace
	case stopped:
		return pointTermFrozen
	}
	return pointBeforeTerm
}

// stage makes the race happen: members die and innocents take their
// numbers. It runs on a gate's goroutine while Kill waits in a read, so it
// reports failures through r.err instead of stopping the test.
func (r *race) stage() {
	r.res.staged = true
	if err := r.doStage(); err != nil {
		r.res.staged = false
		if r.err == nil {
			r.err = err
		}
	}
}

func (r *race) doStage() error {
	maxStart := uint64(0)
	for _, m := range r.recorded {
		maxStart = max(maxStart, m.StartTicks)
	}
	gone := func(cs ...*child) error {
		for _, c := range cs {
			c.Kill()
			if !proc.Poll(10*time.Second, func() bool { return !proc.Exists(procRoot, c.PID) }) {
				return fmt.Errorf("pid %d still in /proc after it was reaped", c.PID)
			}
		}
		// A PID reused within the tick its first owner started in would
		// be indistinguishable: a documented limit of (pid, start time).
		return proc.WaitTickPast(procRoot, maxStart, 10*time.Second)
	}
	thread := func(at int, kill ...*child) error {
		inn, err := r.innocent(&syscall.SysProcAttr{Setpgid: true}, raceComm)
		if err != nil {
			return err
		}
		if err := gone(kill...); err != nil {
			return err
		}
		if err := proc.SetNextPID(procRoot, at); err != nil {
			return err
		}
		if err := inn.NamedThreadAt(at, raceComm); err != nil {
			r.res.staged = false // another task took the number first
			r.res.retries++
			return nil
		}
		r.threads[at] = inn
		return nil
	}

	kind := r.kind
	if kind == kindEscape {
		if !r.canEscape() {
			// A frozen (or dying) member cannot leave its group: that is
			// what the freeze is for. Stage the plain takeover instead.
			kind = kindLeaderGroup
		} else if err := r.stubborn.Setpgid(0); err != nil {
			kind = kindLeaderGroup
		} else {
			r.escaped = true
			n, err := r.stubborn.Sync()
			if err != nil {
				return err
			}
			r.escapeCaught = n
		}
	}
	r.res.kind = kind
	switch kind {
	case kindMember:
		if err := gone(r.member); err != nil {
			return err
		}
		_, err := r.place(r.member.PID, &syscall.SysProcAttr{Setpgid: true})
		return err
	case kindMemberThread:
		return thread(r.member.PID, r.member)
	case kindLeaderGroup:
		if err := gone(asChild(r.stubborn), r.member, r.leader); err != nil {
			return err
		}
		// The member's PID first: the innocent leader's runtime threads
		// would take the numbers right after its own.
		m, err := r.place(r.member.PID, nil)
		if err != nil || m == nil {
			return err
		}
		l, err := r.place(r.leader.PID, &syscall.SysProcAttr{Setpgid: true})
		if err != nil || l == nil {
			return err
		}
		return m.Setpgid(l.PID)
	case kindLeaderThread:
		return thread(r.leader.PID, asChild(r.stubborn), r.member, r.leader)
	case kindEscape:
		if err := gone(r.member, r.leader); err != nil {
			return err
		}
		_, err := r.place(r.leader.PID, &syscall.SysProcAttr{Setpgid: true})
		return err
	}
	return nil
}

// canEscape reports whether the stubborn member can still leave its
// group: alive, not dying and not frozen by Kill. A signal already sent
// lands within moments; the short poll gives it the chance to show.
func (r *race) canEscape() bool {
	if !fingerprint.Alive(procRoot, r.stubborn.Stat) {
		return false
	}
	return !proc.Poll(5*time.Millisecond, func() bool {
		return stopping(r.stubborn.PID) || pending(r.stubborn.PID, syscall.SIGKILL) || !fingerprint.Alive(procRoot, r.stubborn.Stat)
	})
}

// innocent starts a bystander that is part of the trial.
func (r *race) innocent(attr *syscall.SysProcAttr, comm string) (*bystander, error) {
	b, err := startBystander(attr, comm)
	if err != nil {
		return nil, err
	}
	r.innocents = append(r.innocents, b)
	return b, nil
}

// place starts an innocent with PID pid (a few attempts: the kernel hands
// the number to whichever task forks first). A nil bystander means the
// number could not be had; the trial is then not counted as staged.
func (r *race) place(pid int, attr *syscall.SysProcAttr) (*bystander, error) {
	for range 20 {
		if err := proc.SetNextPID(procRoot, pid); err != nil {
			return nil, err
		}
		b, err := r.innocent(attr, raceComm)
		if err != nil {
			return nil, err
		}
		if b.PID == pid {
			return b, nil
		}
		r.res.retries++
	}
	r.res.staged = false
	return nil, nil
}
