package pgkill_test

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// joinerFate is how the late joiner must stand once Kill has returned.
type joinerFate int

const (
	endsByTERM joinerFate = iota
	endsByKILL
	leftAlive // not signalled by Kill; the test's cleanup kills it
)

// TestKillJoiners: a process that joined the recorded group after the scan
// (started later, placed into it with setpgid) is in the group when the
// originals die. Kill must not report the group reaped while it lives, must
// signal it only while it is proven to be in the recorded group, and must
// leave zombies alone.
func TestKillJoiners(t *testing.T) {
	tests := []struct {
		name string
		// leaderless: the leader exits and is reaped before the group is
		// recorded, so Kill has no leader pidfd to ask the group by.
		leaderless bool
		joiner     func() *exec.Cmd
		// joinerZombie: the test kills the joiner before Kill and leaves
		// it unreaped.
		joinerZombie bool
		// reapOriginals: before the search for joiners, the originals'
		// parent (the test) reaps them, so no zombie vouches for the
		// group.
		reapOriginals bool
		// joinerExitsFirst: the search waits until the joiner has died
		// of the group's SIGTERM.
		joinerExitsFirst bool
		// joinerVanishes: between finding the joiner and signalling it,
		// the test kills and reaps it.
		joinerVanishes bool
		// feed: before every search after the first, another joiner that
		// ignores SIGTERM joins the group.
		feed bool

		outcome action.Action
		signals []syscall.Signal
		wantErr string
		joiners int
		fate    joinerFate
	}{
		{
			name:    "joiner ignores SIGTERM",
			joiner:  trapCmd,
			outcome: action.Reaped,
			signals: []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM, syscall.SIGKILL},
			joiners: 1,
			fate:    endsByKILL,
		},
		{
			name:          "joiner ignores SIGTERM, originals reaped: the leader's pidfd proves the group",
			joiner:        trapCmd,
			reapOriginals: true,
			outcome:       action.Reaped,
			signals:       []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM, syscall.SIGKILL},
			joiners:       1,
			fate:          endsByKILL,
		},
		{
			name:       "joiner ignores SIGTERM, no leader: zombie originals prove the group",
			leaderless: true,
			joiner:     trapCmd,
			outcome:    action.Reaped,
			signals:    []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM, syscall.SIGKILL},
			joiners:    1,
			fate:       endsByKILL,
		},
		{
			name:          "joiner ignores SIGTERM, no leader, originals reaped: nothing proves the group",
			leaderless:    true,
			joiner:        trapCmd,
			reapOriginals: true,
			outcome:       action.WouldNotDie,
			signals:       []syscall.Signal{syscall.SIGTERM},
			wantErr:       "no recorded process is left in it",
			fate:          leftAlive,
		},
		{
			name:             "joiner exits on SIGTERM",
			joiner:           sleepCmd,
			joinerExitsFirst: true,
			outcome:          action.Reaped,
			signals:          []syscall.Signal{syscall.SIGTERM},
			fate:             endsByTERM,
		},
		{
			name:          "only a zombie joiner is left in the group",
			joiner:        sleepCmd,
			joinerZombie:  true,
			reapOriginals: true,
			outcome:       action.Reaped,
			signals:       []syscall.Signal{syscall.SIGTERM},
			fate:          endsByKILL, // by the test, before Kill
		},
		{
			name:           "joiner exits between finding and pinning",
			joiner:         trapCmd,
			joinerVanishes: true,
			outcome:        action.Reaped,
			signals:        []syscall.Signal{syscall.SIGTERM},
			joiners:        1,
			fate:           endsByKILL, // by the test
		},
		{
			name:    "joiners keep coming",
			joiner:  trapCmd,
			feed:    true,
			outcome: action.WouldNotDie,
			signals: []syscall.Signal{syscall.SIGTERM,
				syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL},
			wantErr: "kept joining",
			joiners: 3,
			fate:    endsByKILL,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bystander, bst := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
			g, originals := startRecorded(t, tt.leaderless)

			// The late joiner: started after the group was recorded.
			joiner := startInGroup(t, tt.joiner(), g.PGID)
			if tt.joinerZombie {
				if err := joiner.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				proc.WaitState(t, root, joiner.Process.Pid, "Z", waitLong)
			}

			var fed []*exec.Cmd
			before := func(round int) {
				if tt.reapOriginals && round == 1 {
					for _, cmd := range originals {
						proc.Reap(cmd)
						proc.WaitGone(t, root, cmd.Process.Pid, waitLong)
					}
				}
				if tt.joinerExitsFirst && round == 1 {
					proc.WaitState(t, root, joiner.Process.Pid, "Z", waitLong)
				}
				if tt.feed && round > 1 {
					fed = append(fed, startInGroup(t, trapCmd(), g.PGID))
				}
			}
			found := func(round int, found []fingerprint.Stat) {
				if tt.joinerVanishes && round == 1 {
					proc.Reap(joiner)
					proc.WaitGone(t, root, joiner.Process.Pid, waitLong)
				}
			}
			opt := pgkill.Options{Grace: 300 * time.Millisecond, Poll: 5 * time.Millisecond, KillWait: waitLong}
			res := pgkill.Kill(context.Background(), g, pgkill.WithJoinerSeams(opt, before, found))
			wantResult(t, res, tt.outcome, tt.signals, tt.wantErr != "")
			if tt.wantErr != "" && !strings.Contains(res.Err.Error(), tt.wantErr) {
				t.Errorf("Kill error %q, want it to say %q", res.Err, tt.wantErr)
			}
			if len(res.Joiners) != tt.joiners {
				t.Errorf("Kill reported joiners %+v, want %d", res.Joiners, tt.joiners)
			}
			if len(res.Joiners) > 0 && res.Joiners[0].PID != joiner.Process.Pid {
				t.Errorf("first joiner reported %d, want %d", res.Joiners[0].PID, joiner.Process.Pid)
			}

			switch tt.fate {
			case leftAlive:
				// Asleep again, not stopped or dying: it may still be
				// starting up (state R) when Kill returns.
				st := proc.WaitState(t, root, joiner.Process.Pid, "S", waitLong)
				if st.PGID != g.PGID {
					t.Errorf("joiner %d left group %d for %d", st.PID, g.PGID, st.PGID)
				}
			case endsByTERM, endsByKILL:
				want := map[joinerFate]syscall.Signal{endsByTERM: syscall.SIGTERM, endsByKILL: syscall.SIGKILL}[tt.fate]
				if sig := exitSignal(t, joiner); sig != want {
					t.Errorf("joiner %d ended by %v, want %v", joiner.Process.Pid, sig, want)
				}
			}
			for i, cmd := range fed[:max(len(fed)-1, 0)] {
				if sig := exitSignal(t, cmd); sig != syscall.SIGKILL {
					t.Errorf("fed joiner %d (pid %d) ended by %v, want SIGKILL", i, cmd.Process.Pid, sig)
				}
			}
			for _, cmd := range originals {
				if cmd.ProcessState == nil {
					if sig := exitSignal(t, cmd); sig != syscall.SIGTERM {
						t.Errorf("original %d ended by %v, want SIGTERM", cmd.Process.Pid, sig)
					}
				}
			}
			checkUntouched(t, bystander, bst)
		})
	}
}

// startRecorded starts a group of two sleeps and records it. leaderless:
// the group is led by a third process that is killed and reaped before
// the recording, so the recorded group's leader is not among its members.
func startRecorded(t *testing.T, leaderless bool) (pgkill.Group, []*exec.Cmd) {
	t.Helper()
	if !leaderless {
		cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
		return startGroup(t, cmds...), cmds
	}
	leader := sleepCmd()
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	proc.Start(t, leader)
	pgid := leader.Process.Pid
	cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
	g := pgkill.Group{PGID: pgid}
	for _, cmd := range cmds {
		startInGroup(t, cmd, pgid)
		g.Members = append(g.Members, proc.MustStat(t, root, cmd.Process.Pid))
	}
	proc.Reap(leader)
	proc.WaitGone(t, root, pgid, waitLong)
	return g, cmds
}

// startInGroup starts cmd in group pgid and waits until it runs sleep (for
// trapCmd: with SIGTERM ignored).
func startInGroup(t *testing.T, cmd *exec.Cmd, pgid int) *exec.Cmd {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	proc.Start(t, cmd)
	pid := cmd.Process.Pid
	if st := waitSleeping(t, pid); st.PGID != pgid {
		t.Fatalf("test setup: pid %d in group %d, want %d", pid, st.PGID, pgid)
	}
	return cmd
}

// TestKillSearchesOnlyWhenNeeded: right after a tree dies its members are
// zombies until their parent reaps them, which keeps the group from
// looking empty. Kill waits briefly for that instead of searching /proc (a
// system call per process on the host); when the zombies linger, it
// searches, finds nothing alive, and the group is reaped all the same.
func TestKillSearchesOnlyWhenNeeded(t *testing.T) {
	tests := []struct {
		name string
		// reap: the members' parent (the test) reaps them a moment after
		// Kill first finds the group still holds something; otherwise
		// only after Kill has returned.
		reap       bool
		wantSearch bool
	}{
		{name: "parent reaps a moment later: no search", reap: true, wantSearch: false},
		{name: "zombies linger: searched, nothing found", reap: false, wantSearch: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
			g := startGroup(t, cmds...)
			reaped := make(chan struct{})
			before := func(round int) {
				if !tt.reap || round != 1 {
					return
				}
				go func() {
					defer close(reaped)
					// The parent's own latency, which Kill must ride out:
					// the group holds only zombies meanwhile.
					time.Sleep(5 * time.Millisecond)
					for _, c := range cmds {
						c.Wait()
					}
				}()
			}
			searched := false
			opt := pgkill.Options{Grace: waitLong, Poll: 5 * time.Millisecond}
			opt = pgkill.WithSearchSeam(pgkill.WithJoinerSeams(opt, before, nil), func(int) { searched = true })
			res := pgkill.Kill(context.Background(), g, opt)
			if tt.reap {
				<-reaped
			} else {
				for _, c := range cmds {
					proc.Reap(c)
				}
			}
			if res.Outcome != action.Reaped || len(res.Signals) != 1 || len(res.Joiners) != 0 {
				t.Fatalf("Kill = %+v; want reaped by SIGTERM alone, no joiners", res)
			}
			if searched != tt.wantSearch {
				t.Errorf("searched /proc for joiners: %v, want %v", searched, tt.wantSearch)
			}
		})
	}
}
