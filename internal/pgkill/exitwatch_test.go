package pgkill_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// member is one process of a test group: how to start it, when it is
// ready to be recorded, and how it must end.
type member struct {
	cmd   func() *exec.Cmd
	ready func(st fingerprint.Stat) bool
	end   string // cmd.ProcessState.String() once reaped
}

func runsSleep(st fingerprint.Stat) bool { return st.Comm == "sleep" }

// trapsAndWaits: the shell's TERM trap is installed and its background
// sleep runs, so that the group's SIGTERM reaches that sleep too.
func trapsAndWaits(st fingerprint.Stat) bool {
	m, err := proc.SignalMask(root, st.PID, "SigCgt")
	if err != nil || !proc.HasSignal(m, syscall.SIGTERM) {
		return false
	}
	pid := strconv.Itoa(st.PID)
	kids, err := os.ReadFile(root + "/" + pid + "/task/" + pid + "/children")
	if err != nil {
		return false
	}
	for _, f := range strings.Fields(string(kids)) {
		kid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if ks, err := fingerprint.ReadStat(root, kid); err == nil && ks.Comm == "sleep" && ks.PGID == st.PGID {
			return true
		}
	}
	return false
}

var (
	obedient = member{cmd: sleepCmd, ready: runsSleep, end: "signal: terminated"}
	stubborn = member{cmd: trapCmd, ready: runsSleep, end: "signal: killed"}
	// slowExit takes a while to shut down on SIGTERM, then exits 7: the
	// other members' exits wake Kill before it is done.
	slowExit = member{
		cmd: func() *exec.Cmd {
			return exec.Command("sh", "-c", `trap "sleep 0.2; exit 7" TERM; sleep 1000 & wait`)
		},
		ready: trapsAndWaits,
		end:   "exit status 7",
	}
)

// startMembers starts ms in one new process group led by the first and
// returns the recorded group once each member is ready.
func startMembers(tb testing.TB, ms []member) (pgkill.Group, []*exec.Cmd) {
	tb.Helper()
	var g pgkill.Group
	cmds := make([]*exec.Cmd, len(ms))
	for i, m := range ms {
		cmds[i] = m.cmd()
		cmds[i].SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.PGID}
		proc.Start(tb, cmds[i])
		if i == 0 {
			g.PGID = cmds[i].Process.Pid
		}
	}
	for i, m := range ms {
		pid := cmds[i].Process.Pid
		var st fingerprint.Stat
		proc.WaitFor(tb, waitLong, "pid "+strconv.Itoa(pid)+" to be ready", func() bool {
			s, err := fingerprint.ReadStat(root, pid)
			st = s
			return err == nil && m.ready(s)
		})
		if st.PGID != g.PGID {
			tb.Fatalf("test setup: pid %d in group %d, want %d", pid, st.PGID, g.PGID)
		}
		g.Members = append(g.Members, st)
	}
	return g, cmds
}

// stillAlive lists the recorded members alive now; after Kill reported
// the group reaped there must be none.
func stillAlive(g pgkill.Group) []int {
	var pids []int
	for _, m := range g.Members {
		if fingerprint.Alive(root, m) {
			pids = append(pids, m.PID)
		}
	}
	return pids
}

// checkEnds reaps cmds and checks how each ended. A member that Kill left
// alive fails t and is killed, rather than hanging the test in Wait.
func checkEnds(t *testing.T, ms []member, cmds []*exec.Cmd) {
	t.Helper()
	for i, cmd := range cmds {
		st := proc.MustStat(t, root, cmd.Process.Pid)
		if !proc.Poll(waitLong, func() bool { return !fingerprint.Alive(root, st) }) {
			t.Errorf("member %d (pid %d) still alive after Kill", i, cmd.Process.Pid)
			proc.Reap(cmd)
			continue
		}
		_ = cmd.Wait()
		if got := cmd.ProcessState.String(); got != ms[i].end {
			t.Errorf("member %d (pid %d) ended with %q, want %q", i, cmd.Process.Pid, got, ms[i].end)
		}
	}
}

// openFDs lists this process's descriptors with what they refer to.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	dir := "/proc/self/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fds := make(map[string]string, len(ents))
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		fds[e.Name()] = target
	}
	return fds
}

// checkNoLeak fails t if descriptors were opened and not closed since
// before was taken. The listing's own directory descriptor shows in both.
func checkNoLeak(t *testing.T, before map[string]string) {
	t.Helper()
	after := openFDs(t)
	if len(after) == len(before) {
		return
	}
	var extra []string
	for fd, target := range after {
		if before[fd] != target {
			extra = append(extra, fd+" -> "+target)
		}
	}
	sort.Strings(extra)
	t.Errorf("%d descriptors before Kill, %d after; new: %v", len(before), len(after), extra)
}

// TestKillWaitsOnExits: Kill wakes on members' exits but judges the group
// by /proc, so the outcome, the signals sent and how each member ends are
// those of a Kill that only polled — and every pidfd it opened is closed.
func TestKillWaitsOnExits(t *testing.T) {
	tests := []struct {
		name    string
		members []member
		grace   time.Duration
		// zombie makes member 1 exit (SIGKILL, not reaped) before Kill.
		zombie bool
		// cancelAfterTERM cancels ctx once member 0 died of SIGTERM.
		cancelAfterTERM bool
		signals         []syscall.Signal
	}{
		{
			name:    "members exit on SIGTERM",
			members: []member{obedient, obedient, obedient},
			grace:   waitLong,
			signals: []syscall.Signal{syscall.SIGTERM},
		},
		{
			// More members than one wait pins: the rest are seen by
			// the ticks, and the outcome is the same.
			name:    "more members than pidfds held at once",
			members: slices.Repeat([]member{obedient}, 70),
			grace:   waitLong,
			signals: []syscall.Signal{syscall.SIGTERM},
		},
		{
			name:    "one member ignores SIGTERM",
			members: []member{obedient, stubborn, obedient},
			grace:   200 * time.Millisecond,
			signals: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL},
		},
		{
			name:    "leader ignores SIGTERM",
			members: []member{stubborn, obedient},
			grace:   200 * time.Millisecond,
			signals: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL},
		},
		{
			name:    "one member outlives the others' exits",
			members: []member{obedient, slowExit, obedient},
			grace:   waitLong,
			signals: []syscall.Signal{syscall.SIGTERM},
		},
		{
			name: "one member already a zombie",
			members: []member{obedient,
				{cmd: sleepCmd, ready: runsSleep, end: "signal: killed"}, obedient},
			grace:   waitLong,
			zombie:  true,
			signals: []syscall.Signal{syscall.SIGTERM},
		},
		{
			name:            "context cancelled during the grace",
			members:         []member{obedient, stubborn},
			grace:           time.Hour,
			cancelAfterTERM: true,
			signals:         []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, cmds := startMembers(t, tt.members)
			if tt.zombie {
				if err := cmds[1].Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				proc.WaitState(t, root, cmds[1].Process.Pid, "Z", waitLong)
			}
			// Before the watcher starts: its /proc reads open descriptors.
			before := openFDs(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watched := make(chan struct{})
			if tt.cancelAfterTERM {
				first := g.Members[0]
				go func() {
					defer close(watched)
					if proc.Poll(waitLong, func() bool { return !fingerprint.Alive(root, first) }) {
						cancel()
					}
				}()
			} else {
				close(watched)
			}

			res := pgkill.Kill(ctx, g, pgkill.Options{Grace: tt.grace, Poll: 5 * time.Millisecond})
			left := stillAlive(g)
			<-watched
			checkNoLeak(t, before)
			if len(left) != 0 {
				t.Errorf("Kill returned %s while members %v were alive", res.Outcome, left)
			}

			wantResult(t, res, action.Reaped, tt.signals, false)
			checkEnds(t, tt.members, cmds)
		})
	}
}

// noPidfdEnv makes TestKillWithoutPidfds the helper that runs Kill with
// few descriptors left; its value is a JSON noPidfdRequest.
const noPidfdEnv = "KC_PGKILL_NOPIDFD_HELPER"

type noPidfdRequest struct {
	Group pgkill.Group
	Grace time.Duration
	// Free is how many descriptors the helper may still open.
	Free int
	Out  string
}

type noPidfdReport struct {
	killReport
	Opened    int // descriptors a probe could open under the limit
	FDsBefore int
	FDsAfter  int
	Left      []int // members alive when Kill returned
}

// TestKillWithoutPidfds: when descriptors run out (EMFILE), Kill still
// pins one member at a time to signal the group, but cannot hold pidfds
// for all members while it waits. With 2 free descriptors it can hold
// none, with 3 only one; the waiting falls back to polling /proc, reports
// the group correctly and leaks nothing. The limit is set in a helper
// process so that it cannot starve this one.
func TestKillWithoutPidfds(t *testing.T) {
	if spec := os.Getenv(noPidfdEnv); spec != "" {
		noPidfdHelper(t, spec)
		return
	}
	tests := []struct {
		name    string
		free    int
		members []member
		grace   time.Duration
		signals []syscall.Signal
	}{
		{"no pidfd/members exit on SIGTERM", 2, []member{obedient, obedient, obedient}, waitLong, []syscall.Signal{syscall.SIGTERM}},
		{"no pidfd/one member ignores SIGTERM", 2, []member{obedient, stubborn, obedient}, 200 * time.Millisecond, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}},
		{"one pidfd/members exit on SIGTERM", 3, []member{obedient, obedient, obedient}, waitLong, []syscall.Signal{syscall.SIGTERM}},
		{"one pidfd/one member ignores SIGTERM", 3, []member{obedient, stubborn, obedient}, 200 * time.Millisecond, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}},
		{"one pidfd/pinned member outlives the others", 3, []member{slowExit, obedient, obedient}, waitLong, []syscall.Signal{syscall.SIGTERM}},
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, cmds := startMembers(t, tt.members)
			out := filepath.Join(t.TempDir(), "report.json")
			spec, err := json.Marshal(noPidfdRequest{Group: g, Grace: tt.grace, Free: tt.free, Out: out})
			if err != nil {
				t.Fatal(err)
			}
			helper := exec.Command(exe, "-test.run=^TestKillWithoutPidfds$", "-test.count=1")
			helper.Env = append(os.Environ(), noPidfdEnv+"="+string(spec))
			if msg, err := helper.CombinedOutput(); err != nil {
				t.Fatalf("helper: %v; output:\n%s", err, msg)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var rep noPidfdReport
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Opened != tt.free {
				t.Fatalf("test setup: helper could open %d descriptors, want %d", rep.Opened, tt.free)
			}
			if len(rep.Left) != 0 {
				t.Errorf("Kill returned %s while members %v were alive", rep.Outcome, rep.Left)
			}
			if rep.FDsAfter != rep.FDsBefore {
				t.Errorf("helper had %d descriptors before Kill, %d after", rep.FDsBefore, rep.FDsAfter)
			}
			if rep.Outcome != action.Reaped || !reflect.DeepEqual(rep.Signals, tt.signals) || rep.Err != "" {
				t.Errorf("Kill with %d free descriptors = %+v; want reaped, signals %v, no error", tt.free, rep.killReport, tt.signals)
			}
			checkEnds(t, tt.members, cmds)
		})
	}
}

func noPidfdHelper(t *testing.T, spec string) {
	var req noPidfdRequest
	if err := json.Unmarshal([]byte(spec), &req); err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Error(err)
		}
	}()
	low := lim
	low.Cur = uint64(limitLeaving(t, req.Free))
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	rep := noPidfdReport{Opened: probeFree(t)}
	rep.FDsBefore = len(openFDs(t))
	res := pgkill.Kill(context.Background(), req.Group, pgkill.Options{Grace: req.Grace, Poll: 5 * time.Millisecond, KillWait: waitLong})
	rep.Left = stillAlive(req.Group)
	rep.FDsAfter = len(openFDs(t))
	rep.Outcome, rep.Signals = res.Outcome, res.Signals
	if res.Err != nil {
		rep.Err = res.Err.Error()
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(req.Out, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// limitLeaving returns the RLIMIT_NOFILE under which exactly free more
// descriptors can be opened: the kernel hands out the lowest free numbers,
// and only numbers below the limit.
func limitLeaving(t *testing.T, free int) int {
	t.Helper()
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(int(dir.Fd()))
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	open := map[int]bool{}
	for _, n := range names {
		if fd, err := strconv.Atoi(n); err == nil && n != self {
			open[fd] = true
		}
	}
	for fd := 0; ; fd++ {
		if !open[fd] {
			if free--; free == 0 {
				return fd + 1
			}
		}
	}
}

// probeFree opens descriptors until EMFILE, closes them and returns how
// many it got.
func probeFree(t *testing.T) int {
	t.Helper()
	var fds []int
	defer func() {
		for _, fd := range slices.Backward(fds) {
			unix.Close(fd)
		}
	}()
	for len(fds) < 100 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EMFILE) {
			return len(fds)
		}
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	t.Fatal("RLIMIT_NOFILE was not lowered")
	return 0
}
