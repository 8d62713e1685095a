package pgkill_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
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

// init keeps the main thread to the main goroutine, as the programs do,
// so that a group signalled with a tree's UID is signalled from another.
func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	proc.Main()
	if spec := os.Getenv(killAsEnv); spec != "" {
		os.Exit(killHelper(spec))
	}
	os.Exit(m.Run())
}

const (
	root     = fingerprint.DefaultRoot
	waitLong = 10 * time.Second
)

func sleepCmd() *exec.Cmd { return exec.Command("sleep", "1000") }

// waitSleeping waits until pid has exec'd sleep (its comm says so: before
// that it is still a copy of the test) and returns its stat.
func waitSleeping(t testing.TB, pid int) fingerprint.Stat {
	t.Helper()
	var st fingerprint.Stat
	proc.WaitFor(t, waitLong, "pid "+strconv.Itoa(pid)+" to run sleep", func() bool {
		s, err := fingerprint.ReadStat(root, pid)
		st = s
		return err == nil && s.Comm == "sleep"
	})
	return st
}

// trapCmd is a `sleep` that ignores SIGTERM (the ignored disposition
// survives exec).
func trapCmd() *exec.Cmd { return exec.Command("sh", "-c", `trap "" TERM; exec sleep 1000`) }

// startGroup starts cmds in one new process group led by the first, waits
// until each has exec'd sleep, and returns the recorded group.
func startGroup(t testing.TB, cmds ...*exec.Cmd) pgkill.Group {
	t.Helper()
	var g pgkill.Group
	for i, cmd := range cmds {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.PGID}
		proc.Start(t, cmd)
		if i == 0 {
			g.PGID = cmd.Process.Pid
		}
	}
	for _, cmd := range cmds {
		pid := cmd.Process.Pid
		st := waitSleeping(t, pid)
		if st.PGID != g.PGID {
			t.Fatalf("test setup: pid %d in group %d, want %d", pid, st.PGID, g.PGID)
		}
		g.Members = append(g.Members, st)
	}
	return g
}

// startInnocent starts a bystander that reports the signals it catches.
func startInnocent(t *testing.T, attr *syscall.SysProcAttr) (*proc.Innocent, fingerprint.Stat) {
	t.Helper()
	inn, err := proc.StartInnocent(attr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	return inn, proc.MustStat(t, root, inn.PID)
}

// checkUntouched fails t unless the innocent is still the same running
// process and has caught no signal.
func checkUntouched(t *testing.T, inn *proc.Innocent, st fingerprint.Stat) {
	t.Helper()
	now, err := fingerprint.ReadStat(root, inn.PID)
	if err != nil || !fingerprint.Same(now, st) || !fingerprint.Alive(root, st) {
		t.Fatalf("innocent %d: gone or replaced (%+v, %v)", inn.PID, now, err)
	}
	if now.State == 'T' || now.State == 't' {
		t.Fatalf("innocent %d is stopped", inn.PID)
	}
	n, err := inn.Sync()
	if err != nil || n != 0 {
		t.Fatalf("innocent %d caught %d signals %v (%v)", inn.PID, n, inn.Caught(), err)
	}
}

// exitSignal reaps cmd and returns the signal that ended it.
func exitSignal(t *testing.T, cmd *exec.Cmd) syscall.Signal {
	t.Helper()
	_ = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		t.Fatalf("pid %d: %v, not ended by a signal", cmd.Process.Pid, cmd.ProcessState)
	}
	return ws.Signal()
}

// killed SIGKILLs cmd and waits until it is reaped (reap) or a zombie.
func killed(t *testing.T, cmd *exec.Cmd, reap bool) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if reap {
		proc.Reap(cmd)
		proc.WaitGone(t, root, cmd.Process.Pid, waitLong)
	} else {
		proc.WaitState(t, root, cmd.Process.Pid, "Z", waitLong)
	}
}

func wantResult(t *testing.T, got pgkill.Result, outcome action.Action, signals []syscall.Signal, wantErr bool) {
	t.Helper()
	if got.Outcome != outcome || !reflect.DeepEqual(got.Signals, signals) || (got.Err != nil) != wantErr {
		t.Fatalf("Kill = %+v; want outcome %s, signals %v, error %v", got, outcome, signals, wantErr)
	}
}

func TestKillReapsGroup(t *testing.T) {
	bystander, bst := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	cmds := []*exec.Cmd{sleepCmd(), sleepCmd(), sleepCmd()}
	g := startGroup(t, cmds...)

	res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: waitLong, Poll: 5 * time.Millisecond})
	wantResult(t, res, action.Reaped, []syscall.Signal{syscall.SIGTERM}, false)
	if res.PGID != g.PGID {
		t.Errorf("Result.PGID = %d, want %d", res.PGID, g.PGID)
	}
	for _, cmd := range cmds {
		if sig := exitSignal(t, cmd); sig != syscall.SIGTERM {
			t.Errorf("pid %d ended by %v, want SIGTERM", cmd.Process.Pid, sig)
		}
	}
	checkUntouched(t, bystander, bst)
}

func TestKillEscalates(t *testing.T) {
	cmds := []*exec.Cmd{trapCmd(), sleepCmd(), trapCmd()}
	g := startGroup(t, cmds...)
	for _, i := range []int{0, 2} {
		mask, err := proc.SignalMask(root, cmds[i].Process.Pid, "SigIgn")
		if err != nil || !proc.HasSignal(mask, syscall.SIGTERM) {
			t.Fatalf("test setup: pid %d does not ignore SIGTERM (SigIgn %x, %v)", cmds[i].Process.Pid, mask, err)
		}
	}

	const grace = 300 * time.Millisecond
	start := time.Now()
	res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: grace, Poll: 5 * time.Millisecond})
	elapsed := time.Since(start)
	wantResult(t, res, action.Reaped, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, false)
	if elapsed < grace {
		t.Errorf("SIGKILL after %v, before the %v grace", elapsed, grace)
	}
	for i, want := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL} {
		if sig := exitSignal(t, cmds[i]); sig != want {
			t.Errorf("member %d ended by %v, want %v", i, sig, want)
		}
	}
}

// TestKillExpiredContext: an expired context skips the grace.
func TestKillExpiredContext(t *testing.T) {
	g := startGroup(t, trapCmd(), trapCmd())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	res := pgkill.Kill(ctx, g, pgkill.Options{Grace: time.Hour, Poll: 5 * time.Millisecond})
	wantResult(t, res, action.Reaped, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, false)
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Kill took %v with an expired context", d)
	}
}

func TestKillGone(t *testing.T) {
	for _, reap := range []bool{true, false} {
		name := map[bool]string{true: "members reaped", false: "members zombies"}[reap]
		t.Run(name, func(t *testing.T) {
			cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
			g := startGroup(t, cmds...)
			for _, cmd := range cmds {
				killed(t, cmd, reap)
			}
			res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: waitLong})
			wantResult(t, res, action.Gone, nil, false)
		})
	}
}

func TestKillRefuses(t *testing.T) {
	inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	tests := []struct {
		name string
		g    pgkill.Group
	}{
		{"pgid 0", pgkill.Group{PGID: 0, Members: []fingerprint.Stat{st}}},
		{"pgid 1", pgkill.Group{PGID: 1, Members: []fingerprint.Stat{st}}},
		{"pgid -1", pgkill.Group{PGID: -1, Members: []fingerprint.Stat{st}}},
		{"negative pgid", pgkill.Group{PGID: -st.PGID, Members: []fingerprint.Stat{st}}},
		{"no members", pgkill.Group{PGID: st.PGID}},
		{"empty members", pgkill.Group{PGID: st.PGID, Members: []fingerprint.Stat{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := pgkill.Kill(context.Background(), tt.g, pgkill.Options{Grace: 100 * time.Millisecond})
			wantResult(t, res, action.WouldNotDie, nil, true)
			checkUntouched(t, inn, st)
		})
	}
}

// TestKillInnocentOwnsGroup: the recorded PGID now belongs to an innocent
// process group, and no recorded member is an original member of it. No
// signal may be sent to anybody.
func TestKillInnocentOwnsGroup(t *testing.T) {
	inn, ist := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	if ist.PGID != inn.PID {
		t.Fatalf("test setup: innocent %d in group %d", inn.PID, ist.PGID)
	}
	p := inn.PID

	dead := func(reap bool) []fingerprint.Stat {
		cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
		g := startGroup(t, cmds...)
		for _, cmd := range cmds {
			if reap {
				proc.Reap(cmd)
			} else {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				proc.WaitState(t, root, cmd.Process.Pid, "Z", waitLong)
			}
		}
		for i := range g.Members {
			g.Members[i].PGID = p
		}
		return g.Members
	}
	recycled := ist
	recycled.StartTicks--

	// A thread of the innocent, recorded with its own (true) identity.
	var tid int
	proc.WaitFor(t, waitLong, "a second thread in the innocent", func() bool {
		tasks, _ := os.ReadDir(root + "/" + strconv.Itoa(p) + "/task")
		for _, e := range tasks {
			if n, err := strconv.Atoi(e.Name()); err == nil && n != p {
				tid = n
				return true
			}
		}
		return false
	})
	thread := proc.MustStat(t, root, tid)
	thread.PGID = p

	// An original member that has left for a group of its own.
	moved, mst := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
	movedRec := mst
	movedRec.PGID = p

	tests := []struct {
		name    string
		members []fingerprint.Stat
	}{
		{"leader pid recycled", []fingerprint.Stat{recycled}},
		{"members dead and reaped", dead(true)},
		{"members zombies", dead(false)},
		{"leader recycled, members dead", append([]fingerprint.Stat{recycled}, dead(true)...)},
		{"member is a thread of the innocent", []fingerprint.Stat{thread}},
		{"original member moved to another group", []fingerprint.Stat{movedRec}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := pgkill.Group{PGID: p, Members: tt.members}
			res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: 100 * time.Millisecond, Poll: 5 * time.Millisecond})
			// Gone, or, where the innocent could still be the recorded
			// group's own unrecorded leader (born before a recorded
			// member, as these made-up records have it), would-not-die
			// for want of proof: never a signal.
			if len(res.Signals) != 0 || (res.Outcome != action.Gone && res.Outcome != action.WouldNotDie) {
				t.Errorf("Kill = %+v; want gone or would-not-die, and no signal", res)
			}
			checkUntouched(t, inn, ist)
			checkUntouched(t, moved, mst)
		})
	}
}

// TestKillZombieLeader: a group whose leader's main thread has exited (the
// leader shows state Z) while the process runs on is alive and must be
// killed, not reported gone.
func TestKillZombieLeader(t *testing.T) {
	z, err := proc.StartZombieLeader(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Reap(z.Cmd) })
	member := sleepCmd()
	member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: z.PID}
	proc.Start(t, member)
	waitSleeping(t, member.Process.Pid)
	g := pgkill.Group{PGID: z.PID, Members: []fingerprint.Stat{
		proc.MustStat(t, root, z.PID),
		proc.MustStat(t, root, member.Process.Pid),
	}}
	if st := g.Members[0]; st.State != 'Z' || st.Threads < 2 || st.PGID != z.PID {
		t.Fatalf("test setup: leader %+v", st)
	}

	// Kill the sleep first, so that only the zombie-looking leader keeps
	// the group provably ours.
	if err := member.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	proc.WaitState(t, root, member.Process.Pid, "Z", waitLong)

	res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: waitLong, Poll: 5 * time.Millisecond})
	wantResult(t, res, action.Reaped, []syscall.Signal{syscall.SIGTERM}, false)
	if sig := exitSignal(t, z.Cmd); sig != syscall.SIGTERM {
		t.Errorf("zombie-leader process ended by %v, want SIGTERM", sig)
	}
}

// TestKillOthersListsThroughMembers: with Options.Members, KillOthers
// looks through that lister: a process it names that is not in the groups
// (another group's) is re-verified and refused, not signalled; a member it
// misses is found by the /proc listing that checks a look finding none,
// and dies all the same.
func TestKillOthersListsThroughMembers(t *testing.T) {
	g := startGroup(t, exec.Command("sleep", "1000"), exec.Command("sleep", "1000"))
	listed, missed := g.Members[0], g.Members[1]
	other := startGroup(t, exec.Command("sleep", "1000")).Members[0]
	looks := 0
	opt := pgkill.Options{Grace: 2 * time.Second, KillWait: time.Second, Members: func(groups []int) []fingerprint.Stat {
		looks++
		if looks > 1 {
			return nil // misses everything from the second look on
		}
		return []fingerprint.Stat{listed, other}
	}}
	res := pgkill.KillOthers([]int{g.PGID}, opt)
	if looks == 0 {
		t.Fatal("Members was never asked")
	}
	for _, m := range []fingerprint.Stat{listed, missed} {
		if fingerprint.Alive(fingerprint.DefaultRoot, m) {
			t.Errorf("member %d lives on; result %+v", m.PID, res)
		}
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, other) {
		t.Error("a process of another group the lister named was signalled")
	}
	if res.Refused == 0 || len(res.Outlived) > 0 {
		t.Errorf("result %+v: want the other group's process refused and none outliving the grace", res)
	}
}

// TestKillOthersTakesMembersBornDuringTheWait: a member that forks as it
// dies (a TERM handler that starts one more process) leaves a new member
// behind after the first look; KillOthers finds it at the next look and
// returns only once the groups are empty, with both the lister it is
// given and its own /proc listing.
func TestKillOthersTakesMembersBornDuringTheWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members func(groups []int) []fingerprint.Stat
	}{
		{"proc", nil},
		{"lister", func(groups []int) []fingerprint.Stat { return pgkill.Members("", groups...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			born, ready := dir+"/born", dir+"/ready"
			// On SIGTERM the shell starts a new sleep in its group,
			// writes its PID and exits.
			sh := exec.Command("sh", "-c", `trap 'sleep 1000 & echo $! > "$0"; exit 0' TERM; : > "$1"; while :; do sleep 0.05; done`, born, ready)
			sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			proc.Start(t, sh)
			g := pgkill.Group{PGID: sh.Process.Pid}
			proc.WaitFor(t, waitLong, "the shell's TERM handler", func() bool { _, err := os.Stat(ready); return err == nil })
			var data []byte
			res := pgkill.KillOthers([]int{g.PGID}, pgkill.Options{Grace: 5 * time.Second, KillWait: time.Second, Members: tc.members})
			// The handler writes the PID before it exits, which the
			// real KillOthers waits for; a broken one may return first.
			proc.WaitFor(t, waitLong, "the TERM handler's new member", func() bool {
				var err error
				data, err = os.ReadFile(born)
				return err == nil && len(data) > 1
			})
			pid, err := strconv.Atoi(string(data[:len(data)-1]))
			if err != nil {
				t.Fatal(err)
			}
			if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid); err == nil && !st.Zombie() && st.PGID == g.PGID {
				t.Errorf("the member born during the wait (%d) lives on; result %+v", pid, res)
				syscall.Kill(pid, syscall.SIGKILL)
			}
			// Outliving the grace is allowed: a TERM that reaches a child
			// between fork and exec runs the shell's handler, not sleep's
			// default, and only SIGKILL ends it.
			if left := pgkill.Members("", g.PGID); len(left) > 0 || len(res.Left) > 0 {
				t.Errorf("left %+v (result %+v): want the group empty", left, res)
			}
		})
	}
}

// TestKillOthersConfirmsThroughConfirm: with Confirm set, a look at which
// Members finds none is checked through Confirm, not /proc: the member
// Confirm names is signalled, and one neither finds is left (the caller
// vouched that Confirm sees every member Members can miss).
func TestKillOthersConfirmsThroughConfirm(t *testing.T) {
	g := startGroup(t, exec.Command("sleep", "1000"), exec.Command("sleep", "1000"))
	confirmed, unseen := g.Members[0], g.Members[1]
	confirms := 0
	opt := pgkill.Options{Grace: 2 * time.Second, KillWait: time.Second,
		Members: func([]int) []fingerprint.Stat { return nil },
		Confirm: func([]int) []fingerprint.Stat {
			confirms++
			if fingerprint.Alive(fingerprint.DefaultRoot, confirmed) {
				return []fingerprint.Stat{confirmed}
			}
			return nil
		}}
	res := pgkill.KillOthers([]int{g.PGID}, opt)
	if confirms == 0 {
		t.Fatal("Confirm was never asked")
	}
	if fingerprint.Alive(fingerprint.DefaultRoot, confirmed) {
		t.Errorf("the member Confirm named lives on; result %+v", res)
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, unseen) {
		t.Error("a member neither lister named was signalled: /proc was listed")
	}
}

// TestKillGoneLooksForJoiners: the recorded members died before the
// first signal, but a process that joined the group after it was recorded
// (a kernel's worker started since the scan) lives on in it. With a
// recorded zombie still in the group to prove it is the recorded one, the
// joiner is killed; without, it is reported, not signalled, and the tree
// not called gone.
func TestKillGoneLooksForJoiners(t *testing.T) {
	for _, reap := range []bool{false, true} {
		name := map[bool]string{false: "the leader a zombie", true: "the leader reaped"}[reap]
		t.Run(name, func(t *testing.T) {
			leader, joiner := sleepCmd(), sleepCmd()
			g := startGroup(t, leader, joiner)
			recorded := pgkill.Group{PGID: g.PGID, Members: g.Members[:1]}
			killed(t, leader, reap)
			res := pgkill.Kill(context.Background(), recorded, pgkill.Options{Grace: waitLong, Poll: 5 * time.Millisecond})
			if reap {
				wantResult(t, res, action.WouldNotDie, nil, true)
				if !proc.Exists(root, joiner.Process.Pid) || proc.Dead(joiner.Process.Pid) {
					t.Error("a process in a group that could not be proven the recorded one was signalled")
				}
				return
			}
			wantResult(t, res, action.Reaped, []syscall.Signal{syscall.SIGTERM}, false)
			if len(res.Joiners) != 1 || res.Joiners[0].PID != joiner.Process.Pid {
				t.Errorf("joiners %+v, want %d", res.Joiners, joiner.Process.Pid)
			}
			if sig := exitSignal(t, joiner); sig != syscall.SIGTERM {
				t.Errorf("the joiner ended by %v, want SIGTERM", sig)
			}
		})
	}
}

// TestKillMemberLeavesDuringGrace: a member that catches SIGTERM and
// moves to a group of its own during the grace is out of the group's
// reach, and not dead: with CheckUID it is killed as an escaped member is
// (a pidfd, the tree's UID); without, it is reported alive. Either way the
// tree is not taken for reaped while it lives.
func TestKillMemberLeavesDuringGrace(t *testing.T) {
	for _, tc := range []struct {
		checkUID bool
		// stubborn: the leader ignores SIGTERM, so the group still has an
		// occupant for its SIGKILL, which misses the member that left.
		stubborn bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		checkUID := tc.checkUID
		t.Run(fmt.Sprintf("CheckUID %v, leader ignoring SIGTERM %v", checkUID, tc.stubborn), func(t *testing.T) {
			leader := sleepCmd()
			if tc.stubborn {
				leader = trapCmd()
			}
			g := startGroup(t, leader)
			inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true, Pgid: g.PGID})
			st.PGID = g.PGID
			g.Members = append(g.Members, st)
			done := make(chan pgkill.Result, 1)
			go func() {
				done <- pgkill.Kill(context.Background(), g, pgkill.Options{Grace: 2 * time.Second, Poll: 5 * time.Millisecond, UID: 0, CheckUID: checkUID})
			}()
			proc.WaitFor(t, waitLong, "the member's SIGTERM", func() bool { return len(inn.Caught()) > 0 })
			if err := inn.Setpgid(0); err != nil {
				t.Fatal(err)
			}
			res := <-done
			now, err := fingerprint.ReadStat(root, inn.PID)
			alive := err == nil && fingerprint.Same(now, st) && !now.Zombie()
			if checkUID {
				if res.Outcome != action.Reaped || res.Err != nil || alive {
					t.Fatalf("Kill = %+v, the member alive %v; want reaped, the member killed", res, alive)
				}
				if fingerprint.Alive(root, g.Members[0]) {
					t.Fatal("the leader lives on")
				}
				return
			}
			if res.Outcome != action.WouldNotDie || res.Err == nil || !strings.Contains(res.Err.Error(), "left it") || !alive {
				t.Fatalf("Kill = %+v, the member alive %v; want would-not-die naming the member that left, alive", res, alive)
			}
		})
	}
}

// TestKillRefusesAnotherUIDsProcess: with CheckUID, a group whose
// recorded member now runs as another UID than the tree's (a setuid
// program run since the scan; here the tree is recorded as uid 65534's),
// or that a process of another UID joined, is not signalled.
func TestKillRefusesAnotherUIDsProcess(t *testing.T) {
	t.Run("a recorded member", func(t *testing.T) {
		inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
		res := pgkill.Kill(context.Background(), pgkill.Group{PGID: st.PGID, Members: []fingerprint.Stat{st}},
			pgkill.Options{Grace: 100 * time.Millisecond, UID: 65534, CheckUID: true})
		wantResult(t, res, action.WouldNotDie, nil, true)
		checkUntouched(t, inn, st)
	})
	// A setuid program keeps its caller's real UID: the effective and
	// saved ones count too.
	t.Run("a recorded member running setuid", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		cmd := exec.Command("setpriv", "--ruid=65534", "--euid=0", "--init-groups", "sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		proc.Start(t, cmd)
		st := waitSleeping(t, cmd.Process.Pid)
		res := pgkill.Kill(context.Background(), pgkill.Group{PGID: st.PGID, Members: []fingerprint.Stat{st}},
			pgkill.Options{Grace: 100 * time.Millisecond, UID: 65534, CheckUID: true})
		if res.Outcome != action.WouldNotDie || len(res.Signals) != 0 || res.Err == nil || !strings.Contains(res.Err.Error(), "[65534 0 0]") {
			t.Errorf("Kill = %+v; want would-not-die, no signal, naming the effective UID", res)
		}
		if now, err := fingerprint.ReadStat(root, st.PID); err != nil || !fingerprint.Same(now, st) || now.Zombie() || now.State == 'T' {
			t.Errorf("the setuid member: %+v, %v", now, err)
		}
	})
	// Of a tree of uid 65534's, a root process joined the group after it
	// was recorded: the group's signals, sent as 65534, never reach it,
	// and the search for joiners names it and signals nothing more.
	t.Run("a joiner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: the tree runs as another user")
		}
		nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
		leader := trapCmd()
		leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: nobody}
		proc.Start(t, leader)
		lst := waitSleeping(t, leader.Process.Pid)
		inn, ist := startInnocent(t, &syscall.SysProcAttr{Setpgid: true, Pgid: lst.PGID})
		res := pgkill.Kill(context.Background(), pgkill.Group{PGID: lst.PGID, Members: []fingerprint.Stat{lst}},
			pgkill.Options{Grace: 200 * time.Millisecond, Poll: 5 * time.Millisecond, UID: 65534, CheckUID: true})
		if res.Outcome != action.WouldNotDie || res.Err == nil || !strings.Contains(res.Err.Error(), "uid 0") {
			t.Errorf("Kill = %+v; want would-not-die naming the root joiner", res)
		}
		if sig := exitSignal(t, leader); sig != syscall.SIGKILL {
			t.Errorf("the tree's own process ended by %v, want SIGKILL (it ignores SIGTERM)", sig)
		}
		checkUntouched(t, inn, ist)
		// The UID was taken by a thread of its own, which took root's
		// back: the program's (its main thread's, as /proc and kill(2)
		// see it) is root's.
		status, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "Uid:") && strings.Join(strings.Fields(l)[1:], " ") != "0 0 0 0" {
				t.Errorf("the program's UIDs after signalling as 65534: %q", l)
			}
		}
	})
}

// TestKillGoneUnrecordedLeader: the group's leader was left out of the
// record (its argv could not be read) and the recorded members died
// before the kill. The live process holding the group's number was born
// before them: it is the group's own leader, not a stranger that got the
// number later, so the tree is not reported gone while it lives.
func TestKillGoneUnrecordedLeader(t *testing.T) {
	leader, member := sleepCmd(), sleepCmd()
	g := startGroup(t, leader, member)
	recorded := pgkill.Group{PGID: g.PGID, Members: g.Members[1:]}
	if err := member.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	proc.Reap(member)
	proc.WaitGone(t, root, member.Process.Pid, waitLong)
	res := pgkill.Kill(context.Background(), recorded, pgkill.Options{Grace: waitLong, Poll: 5 * time.Millisecond})
	if res.Outcome == action.Gone {
		t.Fatalf("Kill = %+v; the group's live leader was not looked for", res)
	}
	if len(res.Signals) != 0 {
		t.Errorf("signals %v to a group no recorded process vouches for", res.Signals)
	}
}

// TestKillRefusesWhatItCannotVouchFor: with CheckUID, a member whose
// status cannot be read whole (a Uid line short of the effective and
// saved UIDs) is not signalled: its identity cannot be checked, so it is
// not even pinned; a recorded member that left the group and now runs
// setuid (real UID the tree's, effective root) is not killed as an
// escaped member either.
func TestKillRefusesWhatItCannotVouchFor(t *testing.T) {
	t.Run("status unreadable", func(t *testing.T) {
		inn, st := startInnocent(t, &syscall.SysProcAttr{Setpgid: true})
		fake := filepath.Join(t.TempDir(), strconv.Itoa(st.PID))
		if err := os.Mkdir(fake, 0o755); err != nil {
			t.Fatal(err)
		}
		stat, err := os.ReadFile(filepath.Join(root, strconv.Itoa(st.PID), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		status := fmt.Sprintf("Name:\tinnocent\nTgid:\t%d\nPid:\t%d\nUid:\t0\n", st.PID, st.PID)
		for name, data := range map[string]string{"stat": string(stat), "status": status} {
			if err := os.WriteFile(filepath.Join(fake, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		res := pgkill.Kill(context.Background(), pgkill.Group{PGID: st.PGID, Members: []fingerprint.Stat{st}},
			pgkill.Options{Root: filepath.Dir(fake), Grace: 100 * time.Millisecond, UID: 0, CheckUID: true})
		if res.Outcome != action.WouldNotDie || len(res.Signals) != 0 {
			t.Errorf("Kill = %+v; want would-not-die, no signal", res)
		}
		checkUntouched(t, inn, st)
	})
	t.Run("left the group, running setuid", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		other := sleepCmd()
		g := startGroup(t, other)
		cmd := exec.Command("setpriv", "--ruid=65534", "--euid=0", "--init-groups", "sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		proc.Start(t, cmd)
		st := waitSleeping(t, cmd.Process.Pid)
		st.PGID = g.PGID // recorded in the group, since left for one of its own
		res := pgkill.Kill(context.Background(), pgkill.Group{PGID: g.PGID, Members: []fingerprint.Stat{st}},
			pgkill.Options{Grace: 100 * time.Millisecond, UID: 65534, CheckUID: true})
		if res.Outcome != action.WouldNotDie || res.Err == nil {
			t.Errorf("Kill = %+v; want would-not-die", res)
		}
		if now, err := fingerprint.ReadStat(root, st.PID); err != nil || now.StartTicks != st.StartTicks || now.Zombie() {
			t.Errorf("the setuid member that left was killed: %+v, %v", now, err)
		}
	})
}

// TestSignalAsGivesTheThreadBack: the thread a group's signal went out
// from as the tree's UID is root's again afterwards, and alive. A thread
// that ended would have fired PR_SET_PDEATHSIG on whatever the program
// had forked from it (watch's `podman events`, a podman CLI query).
func TestSignalAsGivesTheThreadBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("signalling as another UID needs root")
	}
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for range 20 {
		tid, err := pgkill.SignalAs(cmd.Process.Pid, 0, 65534)
		if err != nil {
			t.Fatalf("signal 0 to uid 65534's group as 65534: %v", err)
		}
		if tid == 0 || tid == os.Getpid() {
			t.Fatalf("signalled from thread %d, want one of its own", tid)
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
		if err != nil {
			t.Fatalf("the thread that signalled is gone: %v", err)
		}
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "Uid:") && strings.Join(strings.Fields(l)[1:], " ") != "0 0 0 0" {
				t.Fatalf("thread %d after signalling as 65534: %q", tid, l)
			}
		}
	}
	// The kernel still refuses what 65534 could not send.
	root := exec.Command("sleep", "1000")
	root.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Process.Kill(); root.Wait() })
	if _, err := pgkill.SignalAs(root.Process.Pid, 0, 65534); !errors.Is(err, syscall.EPERM) {
		t.Errorf("signal 0 to root's group as 65534: %v, want EPERM", err)
	}
}
