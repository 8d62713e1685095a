package pgkill_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// joinerReuseScenario says what happens to the group's numbers while
// Kill looks for joiners.
type joinerReuseScenario struct {
	name string
	// reborn: instead of a joiner's PID, the recorded group's number is
	// taken: every recorded process dies and is reaped before the search,
	// and innocents form a new group under the same number.
	reborn bool
	// thread: the joiner's PID comes back as a thread of an innocent.
	thread bool
	// leaderless: the recorded group's leader exited before the scan, so
	// Kill has no leader pidfd to ask the group by.
	leaderless bool
}

var joinerReuseScenarios = []joinerReuseScenario{
	{name: "joiner-pid/innocent-process"},
	{name: "joiner-pid/innocent-thread", thread: true},
	{name: "group-reborn/leader-recorded", reborn: true},
	{name: "group-reborn/leaderless", reborn: true, leaderless: true},
}

// TestKillJoinerPIDReuse: what Kill finds in the group once the originals
// are dead is known by numbers, which can change hands. Between finding a
// joiner and signalling it, the joiner dies and an innocent process or
// thread takes its PID; or, before the search, the whole recorded group
// dies and innocents form a new group under its number. Kill must send
// nothing to the innocents. Like TestPIDReuse it runs as PID 1 of a new
// PID namespace, where ns_last_pid hands out the numbers.
func TestKillJoinerPIDReuse(t *testing.T) {
	if proc.InPIDNamespace() {
		joinerReuseHelper(t)
		return
	}
	sum := runReuseTrials(t, "TestKillJoinerPIDReuse", "joiner PID reuse", 40, 12)
	for _, sc := range joinerReuseScenarios {
		if sum.Trials[sc.name] == 0 {
			t.Errorf("scenario %s never completed", sc.name)
		}
	}
}

func joinerReuseHelper(t *testing.T) {
	runHelperTrials(t, len(joinerReuseScenarios), func(i int) (string, int, error) {
		sc := joinerReuseScenarios[i]
		signals, err := joinerReuseTrial(t, sc)
		return sc.name, signals, err
	})
}

// joinerReuseTrial records a group, lets a joiner in (or not), stages the
// takeover from inside Kill, and returns the number of signals that
// reached the innocents.
func joinerReuseTrial(t *testing.T, sc joinerReuseScenario) (int, error) {
	var cleanup []func()
	defer func() {
		for _, f := range slices.Backward(cleanup) {
			f()
		}
	}()
	start := func(cmd *exec.Cmd, pgid int) (fingerprint.Stat, error) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
		if err := cmd.Start(); err != nil {
			return fingerprint.Stat{}, err
		}
		cleanup = append(cleanup, func() { proc.Reap(cmd) })
		var st fingerprint.Stat
		var err error
		if !proc.Poll(waitLong, func() bool {
			st, err = fingerprint.ReadStat(root, cmd.Process.Pid)
			return err == nil && st.Comm == "sleep"
		}) {
			return st, fmt.Errorf("pid %d never ran sleep (%v)", cmd.Process.Pid, err)
		}
		return st, nil
	}
	type victim struct {
		inn *proc.Innocent
		st  fingerprint.Stat // its identity before Kill
	}
	var victims []victim
	innocent := func(attr *syscall.SysProcAttr) (*proc.Innocent, error) {
		inn, err := proc.StartInnocent(attr)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, inn.Close)
		st, err := fingerprint.ReadStat(root, inn.PID)
		if err != nil {
			return nil, err
		}
		victims = append(victims, victim{inn, st})
		return inn, nil
	}

	// 1. The recorded group: two sleeps that die on SIGTERM.
	g := pgkill.Group{}
	var originals []*exec.Cmd
	if sc.leaderless {
		leader := sleepCmd()
		st, err := start(leader, 0)
		if err != nil {
			return 0, err
		}
		g.PGID = st.PID
		for range 2 {
			cmd := sleepCmd()
			st, err := start(cmd, g.PGID)
			if err != nil {
				return 0, err
			}
			originals = append(originals, cmd)
			g.Members = append(g.Members, st)
		}
		proc.Reap(leader)
		if !proc.Poll(waitLong, func() bool { return !proc.Exists(root, g.PGID) }) {
			return 0, fmt.Errorf("leader %d still in /proc after reaping", g.PGID)
		}
	} else {
		for range 2 {
			cmd := sleepCmd()
			st, err := start(cmd, g.PGID)
			if err != nil {
				return 0, err
			}
			if g.PGID == 0 {
				g.PGID = st.PID
			}
			originals = append(originals, cmd)
			g.Members = append(g.Members, st)
		}
	}

	// 2. The joiner, started after the recording; it ignores SIGTERM.
	var joiner *exec.Cmd
	var jst fingerprint.Stat
	if !sc.reborn {
		joiner = trapCmd()
		var err error
		if jst, err = start(joiner, g.PGID); err != nil {
			return 0, err
		}
	}
	// A thread innocent exists before the race, as a thread's process
	// would.
	var threadInn *proc.Innocent
	if sc.thread {
		var err error
		if threadInn, err = innocent(&syscall.SysProcAttr{Setpgid: true}); err != nil {
			return 0, err
		}
	}

	// 3. The takeover, staged from inside Kill.
	placed := false
	var stageErr error
	place := func(pid int, attr *syscall.SysProcAttr) (*proc.Innocent, error) {
		if err := proc.SetNextPID(root, pid); err != nil {
			return nil, err
		}
		inn, err := innocent(attr)
		if err != nil || inn.PID != pid {
			return nil, err
		}
		return inn, nil
	}
	stage := func() error {
		maxStart := jst.StartTicks
		for _, m := range g.Members {
			maxStart = max(maxStart, m.StartTicks)
		}
		if sc.reborn {
			// Every recorded process is dead of the SIGTERM; reaping them
			// frees the group's number.
			for _, cmd := range originals {
				proc.Reap(cmd)
				if !proc.Poll(waitLong, func() bool { return !proc.Exists(root, cmd.Process.Pid) }) {
					return fmt.Errorf("pid %d still in /proc after reaping", cmd.Process.Pid)
				}
			}
			if err := proc.WaitTickPast(root, maxStart, waitLong); err != nil {
				return err
			}
			lead, err := place(g.PGID, &syscall.SysProcAttr{Setpgid: true})
			if err != nil || lead == nil {
				return err
			}
			other, err := innocent(nil)
			if err != nil {
				return err
			}
			if err := other.Setpgid(g.PGID); err != nil {
				return err
			}
			for i := range victims {
				// Their identities as members of the reborn group.
				v := &victims[i]
				if v.inn != lead && v.inn != other {
					continue
				}
				st, err := fingerprint.ReadStat(root, v.inn.PID)
				if err != nil || st.PGID != g.PGID {
					return fmt.Errorf("innocent %d not in the reborn group %d: %+v, %v", v.inn.PID, g.PGID, st, err)
				}
				v.st = st
			}
			placed = true
			return nil
		}
		proc.Reap(joiner)
		if !proc.Poll(waitLong, func() bool { return !proc.Exists(root, jst.PID) }) {
			return fmt.Errorf("joiner %d still in /proc after reaping", jst.PID)
		}
		if err := proc.WaitTickPast(root, maxStart, waitLong); err != nil {
			return err
		}
		if sc.thread {
			if err := proc.SetNextPID(root, jst.PID); err != nil {
				return err
			}
			if threadInn.ThreadAt(jst.PID) != nil {
				return nil // another task took the number
			}
		} else {
			inn, err := place(jst.PID, &syscall.SysProcAttr{Setpgid: true})
			if err != nil || inn == nil {
				return err
			}
		}
		now, err := fingerprint.ReadStat(root, jst.PID)
		if err != nil || now.StartTicks == jst.StartTicks || now.PGID == g.PGID {
			return fmt.Errorf("joiner pid %d not taken over by an innocent outside the group: %+v, %v", jst.PID, now, err)
		}
		placed = true
		return nil
	}
	before := func(round int) {
		if sc.reborn && round == 1 {
			stageErr = stage()
		}
	}
	found := func(round int, found []fingerprint.Stat) {
		if !sc.reborn && round == 1 {
			if len(found) != 1 || !fingerprint.Same(found[0], jst) {
				stageErr = fmt.Errorf("joiners found %+v, want only %d", found, jst.PID)
				return
			}
			stageErr = stage()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	opt := pgkill.Options{Root: root, Grace: 100 * time.Millisecond, Poll: 5 * time.Millisecond, KillWait: time.Second}
	res := pgkill.Kill(ctx, g, pgkill.WithJoinerSeams(opt, before, found))
	cancel()
	if stageErr != nil {
		return 0, stageErr
	}
	if !placed {
		return 0, errRetry
	}

	// 4. Kill must have sent nothing after the originals' SIGTERM, and
	// said what it could tell.
	wantOutcome, wantJoiners, wantErr := action.Reaped, 1, ""
	if sc.reborn {
		wantJoiners = 0
		if sc.leaderless {
			// Nothing recorded is left to tell the groups apart.
			wantOutcome, wantErr = action.WouldNotDie, "no recorded process is left in it"
		}
	}
	if res.Outcome != wantOutcome || !slices.Equal(res.Signals, []syscall.Signal{syscall.SIGTERM}) ||
		len(res.Joiners) != wantJoiners || (res.Err != nil) != (wantErr != "") ||
		(res.Err != nil && !strings.Contains(res.Err.Error(), wantErr)) {
		t.Errorf("%s: Kill = %+v; want %s, only the originals' SIGTERM, %d joiners, error %q", sc.name, res, wantOutcome, wantJoiners, wantErr)
	}

	// 5. Count what reached the innocents.
	signals := 0
	for _, v := range victims {
		n, _ := harmed(t, sc.name, v.inn, v.st)
		signals += n
	}
	if sc.thread {
		if tgid, err := proc.StatusField(root, jst.PID, "Tgid"); err != nil || tgid != strconv.Itoa(threadInn.PID) {
			t.Errorf("%s: thread %d of innocent %d gone (%q, %v)", sc.name, jst.PID, threadInn.PID, tgid, err)
			signals++
		}
	}
	return signals, nil
}
