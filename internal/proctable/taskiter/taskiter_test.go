package taskiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func TestMain(m *testing.M) {
	proc.Main()
	os.Exit(m.Run())
}

const (
	root     = fingerprint.DefaultRoot
	waitLong = 10 * time.Second
)

// list runs Each and returns copies of the tasks it gave, in its order.
func list(t *testing.T) []Task {
	t.Helper()
	var tasks []Task
	_, err := Each(func(task *Task) { tasks = append(tasks, *task) })
	if err != nil {
		if Unsupported(err) {
			t.Skipf("task iterator not usable on this host: %v", err)
		}
		t.Fatalf("Each: %v", err)
	}
	return tasks
}

// procPIDs lists the processes /proc shows.
func procPIDs(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]bool{}
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids[pid] = true
		}
	}
	return pids
}

// mismatch says how the iterator's record of a process differs from its
// stat, or "" when it does not.
func mismatch(task Task, st fingerprint.Stat) string {
	var diffs []string
	if task.PGID != st.PGID {
		diffs = append(diffs, fmt.Sprintf("pgid %d, stat %d", task.PGID, st.PGID))
	}
	if task.PPID != st.PPID {
		diffs = append(diffs, fmt.Sprintf("ppid %d, stat %d", task.PPID, st.PPID))
	}
	if task.StartTicks != st.StartTicks {
		diffs = append(diffs, fmt.Sprintf("start %d, stat %d", task.StartTicks, st.StartTicks))
	}
	if string(task.Comm()) != st.Comm {
		diffs = append(diffs, fmt.Sprintf("comm %q, stat %q", task.Comm(), st.Comm))
	}
	if task.Threads != st.Threads {
		diffs = append(diffs, fmt.Sprintf("threads %d, stat %d", task.Threads, st.Threads))
	}
	if task.Zombie() != st.Zombie() {
		diffs = append(diffs, fmt.Sprintf("Zombie() %v, stat %v (exit_state %d, state %c)", task.Zombie(), st.Zombie(), task.ExitState, st.State))
	}
	if (task.ExitState != 0) != (st.State == 'Z' || st.State == 'X') {
		diffs = append(diffs, fmt.Sprintf("exit_state %d, stat state %c", task.ExitState, st.State))
	}
	return strings.Join(diffs, "; ")
}

// oddName is exec'd through a symlink of that name: comm is the last
// element of the path given to execve, cut to 15 bytes. It reads like the
// end of a comm and the next stat fields, to catch any parsing by ")",
// and is longer than a comm holds.
const oddName = "a b) (c) Z 1 (d) R 2"

func startOddComm(t *testing.T) (pid int, comm string) {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), oddName)
	if err := os.Symlink(sleep, link); err != nil {
		t.Fatal(err)
	}
	cmd := proc.Start(t, exec.Command(link, "1000"))
	comm = oddName[:15]
	proc.WaitFor(t, waitLong, "the odd-named sleep to exec", func() bool {
		st, err := fingerprint.ReadStat(root, cmd.Process.Pid)
		return err == nil && st.Comm == comm
	})
	return cmd.Process.Pid, comm
}

// TestEachMatchesProc compares the iterator's record of processes in
// every shape that matters to its callers with what /proc says of them.
func TestEachMatchesProc(t *testing.T) {
	leader, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Close)
	member, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true, Pgid: leader.PID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(member.Close)
	// A child that has exited and that nobody has waited for yet.
	zombie := proc.Start(t, exec.Command("true")).Process.Pid
	proc.WaitState(t, root, zombie, "Z", waitLong)
	odd, oddComm := startOddComm(t)
	zl, err := proc.StartZombieLeader(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Reap(zl.Cmd) })

	fixtures := []struct {
		name string
		pid  int
		// is checks that the fixture is what it is meant to be, so that
		// a passing comparison means something.
		is func(st fingerprint.Stat) bool
	}{
		{"group leader", leader.PID, func(st fingerprint.Stat) bool { return st.PGID == leader.PID }},
		{"group member", member.PID, func(st fingerprint.Stat) bool { return st.PGID == leader.PID }},
		{"zombie", zombie, func(st fingerprint.Stat) bool { return st.State == 'Z' && st.Zombie() }},
		{"comm with blanks and parentheses", odd, func(st fingerprint.Stat) bool { return st.Comm == oddComm }},
		{"leader exited, threads live", zl.PID, func(st fingerprint.Stat) bool {
			return st.State == 'Z' && st.Threads > 1 && !st.Zombie()
		}},
		{"this process", os.Getpid(), func(st fingerprint.Stat) bool { return st.PGID == unix.Getpgrp() }},
		{"kernel thread (kthreadd)", 2, func(st fingerprint.Stat) bool { return st.PGID == 0 && st.Comm == "kthreadd" }},
	}
	stats := func() []fingerprint.Stat {
		out := make([]fingerprint.Stat, len(fixtures))
		for i, f := range fixtures {
			out[i] = proc.MustStat(t, root, f.pid)
		}
		return out
	}
	// A Go process may start a thread at any time, which would change
	// its thread count under the iterator: compare a pass only against
	// stats that were the same before and after it.
	var tasks map[int]Task
	var after []fingerprint.Stat
	proc.WaitFor(t, waitLong, "a pass during which the fixtures did not change", func() bool {
		before := stats()
		tasks = map[int]Task{}
		for _, task := range list(t) {
			tasks[task.PID] = task
		}
		after = stats()
		for i := range before {
			if before[i] != after[i] {
				return false
			}
		}
		return true
	})
	for i, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			st := after[i]
			if !f.is(st) {
				t.Fatalf("test setup: pid %d is not a %s: %+v", f.pid, f.name, st)
			}
			task, ok := tasks[f.pid]
			if !ok {
				t.Fatalf("pid %d missing from the listing", f.pid)
			}
			if d := mismatch(task, st); d != "" {
				t.Errorf("pid %d: %s", f.pid, d)
			}
		})
	}

	// Threads are not processes: neither the zombie leader's live thread
	// nor one of this process may be listed.
	tids := []int{proc.Thread(t)}
	ents, err := os.ReadDir(fmt.Sprintf("%s/%d/task", root, zl.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != zl.PID {
			tids = append(tids, tid)
		}
	}
	if len(tids) < 2 {
		t.Fatalf("test setup: zombie leader %d has no other thread", zl.PID)
	}
	for _, task := range list(t) {
		for _, tid := range tids {
			if task.PID == tid {
				t.Errorf("thread %d listed as a process", tid)
			}
		}
	}
}

// hidden reports whether root is refused a look into pid's namespaces.
// On the VMs this runs on, the sandbox's own init (PID 1) is such a
// process, and the kernel's task iterator does not visit any of its
// threads: /proc lists it, no iterator program is ever called for it.
func hidden(pid int) bool {
	_, err := os.Readlink(fmt.Sprintf("%s/%d/ns/pid", root, pid))
	return errors.Is(err, fs.ErrPermission)
}

// TestEachListing checks the listing as a whole against /proc.
func TestEachListing(t *testing.T) {
	start, err := proc.UptimeTicks(root)
	if err != nil {
		t.Fatal(err)
	}
	before := procPIDs(t)
	tasks := list(t)
	after := procPIDs(t)

	listed := map[int]bool{}
	for i, task := range tasks {
		if listed[task.PID] {
			t.Errorf("pid %d listed twice", task.PID)
		}
		listed[task.PID] = true
		if i > 0 && task.PID <= tasks[i-1].PID {
			t.Errorf("pid %d listed after %d: not ascending", task.PID, tasks[i-1].PID)
		}
		if task.PID <= 0 {
			t.Errorf("pid %d listed", task.PID)
		}
	}
	if !listed[os.Getpid()] {
		t.Errorf("this process (%d) is not listed", os.Getpid())
	}
	// A process /proc shows both before and after the pass was there all
	// along, unless it exited and its PID was taken again in between: one
	// that still runs and started before the first listing was.
	missing := 0
	for pid := range before {
		if !after[pid] || listed[pid] {
			continue
		}
		st, err := fingerprint.ReadStat(root, pid)
		if err != nil || st.StartTicks >= start {
			continue
		}
		if hidden(pid) {
			t.Logf("pid %d (%s) missing from the listing; root may not inspect it either", pid, st.Comm)
			continue
		}
		missing++
		if missing <= 10 {
			t.Errorf("pid %d (%s, started at tick %d) shown by /proc throughout, missing from the listing", pid, st.Comm, st.StartTicks)
		}
	}
	if missing > 10 {
		t.Errorf("%d processes missing in all", missing)
	}
	t.Logf("%d processes listed; /proc showed %d before, %d after", len(tasks), len(before), len(after))
}

// TestEachAgreesWithStat compares every user process of the host, not
// only fixtures: the layout read from BTF must hold for all of them. A
// process that changed under the pass (exited, renamed, moved group,
// started a thread) is compared again after another pass; only a
// disagreement that lasts is a failure.
func TestEachAgreesWithStat(t *testing.T) {
	// compare returns how the processes of one pass (those in only, if
	// not nil) disagree with their stat, and how many were compared.
	compare := func(only map[int]string) (map[int]string, int) {
		out := map[int]string{}
		compared := 0
		for _, task := range list(t) {
			if _, ok := only[task.PID]; only != nil && !ok {
				continue
			}
			st, err := fingerprint.ReadStat(root, task.PID)
			if err != nil || st.StartTicks > task.StartTicks {
				continue // gone, or its PID taken again since
			}
			// Kernel threads' stat shows the full name where comm holds
			// only 15 bytes (workqueue workers say what they work on).
			if st.PID == 2 || st.PPID == 2 {
				continue
			}
			compared++
			if d := mismatch(task, st); d != "" {
				out[task.PID] = d
			}
		}
		return out, compared
	}
	pending, compared := compare(nil)
	// Skipping PIDs taken again must not hide a start time read wrong.
	if compared < 2 || len(pending) > compared/2 {
		t.Fatalf("%d user processes compared, %d disagree", compared, len(pending))
	}
	for pass := 0; len(pending) > 0 && pass < 4; pass++ {
		pending, _ = compare(pending)
	}
	n := 0
	for pid, d := range pending {
		if n++; n <= 10 {
			t.Errorf("pid %d: %s", pid, d)
		}
	}
	if len(pending) > 10 {
		t.Errorf("%d processes disagree with /proc in all", len(pending))
	}
	t.Logf("%d user processes compared", compared)
}

// nsSummary is what the copy of this test binary in a new PID namespace
// reports.
type nsSummary struct {
	Cases []nsCase
}

type nsCase struct {
	Name        string
	Err         string
	Unavailable bool
	Calls       int
}

// TestEachRefusesInPIDNamespace runs Each as PID 1 of a new PID
// namespace, where the iterator would list only that namespace's tasks
// (and /proc, once remounted, other numbers): it must refuse, and leave
// any fallback to its caller.
func TestEachRefusesInPIDNamespace(t *testing.T) {
	if proc.InPIDNamespace() {
		var sum nsSummary
		try := func(name string) {
			calls := 0
			_, err := Each(func(*Task) { calls++ })
			c := nsCase{Name: name, Unavailable: errors.Is(err, ErrUnavailable), Calls: calls}
			if err != nil {
				c.Err = err.Error()
			}
			sum.Cases = append(sum.Cases, c)
		}
		// The copy starts with the host's /proc mounted: /proc/self
		// still names it, by its host PID.
		try("host /proc")
		proc.EnterPIDNamespace(t)
		try("own /proc")
		proc.WriteSummary(t, sum)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a new PID namespace")
	}
	var sum nsSummary
	proc.RunInPIDNamespace(t, "TestEachRefusesInPIDNamespace", time.Minute, &sum)
	if len(sum.Cases) != 2 {
		t.Fatalf("helper reported %d cases, want 2: %+v", len(sum.Cases), sum)
	}
	for _, c := range sum.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if !c.Unavailable || !strings.Contains(c.Err, "pid namespace") {
				t.Errorf("Each = %q; want ErrUnavailable for the PID namespace", c.Err)
			}
			if c.Calls != 0 {
				t.Errorf("Each called fn %d times before refusing", c.Calls)
			}
		})
	}
}

// TestReadRecords feeds readRecords through a pipe, whose reads end
// wherever the writer's data does.
func TestReadRecords(t *testing.T) {
	record := func(i int) []byte {
		rec := make([]byte, recordSize)
		for j := range rec {
			rec[j] = byte(i + j)
		}
		binary.NativeEndian.PutUint32(rec, uint32(i))
		return rec
	}
	tests := []struct {
		name    string
		records int
		chunks  []int // write sizes, repeated; the last write takes the rest
		extra   int   // bytes after the last whole record
		error   string
	}{
		{"empty", 0, nil, 0, ""},
		{"one record", 1, nil, 0, ""},
		// 32 KiB, the read size, is no multiple of 40: a record spans
		// two reads even when the writer is done before the first.
		{"more than one read", 2000, nil, 0, ""},
		{"odd writes", 300, []int{1, 39, 41, 17, 80, 3}, 0, ""},
		{"bytes left over", 3, []int{7}, 13, "left over"},
		{"only a part record", 0, nil, 39, "left over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var data []byte
			for i := range tt.records {
				data = append(data, record(i)...)
			}
			data = append(data, make([]byte, tt.extra)...)
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			wrote := make(chan error, 1)
			go func() {
				defer unix.Close(p[1])
				rest := data
				for i := 0; len(rest) > 0; i++ {
					n := len(rest)
					if len(tt.chunks) > 0 {
						n = min(n, tt.chunks[i%len(tt.chunks)])
					}
					if _, err := unix.Write(p[1], rest[:n]); err != nil {
						wrote <- err
						return
					}
					rest = rest[n:]
				}
				wrote <- nil
			}()
			got := 0
			err := readRecords(p[0], func(rec []byte) {
				if len(rec) != recordSize {
					t.Fatalf("record of %d bytes", len(rec))
				}
				if want := record(got); string(rec) != string(want) {
					t.Fatalf("record %d = % x, want % x", got, rec, want)
				}
				got++
			})
			if werr := <-wrote; werr != nil {
				t.Fatal(werr)
			}
			if tt.error != "" {
				if err == nil || !strings.Contains(err.Error(), tt.error) {
					t.Fatalf("readRecords error = %v, want %q", err, tt.error)
				}
			} else if err != nil {
				t.Fatalf("readRecords: %v", err)
			}
			if got != tt.records {
				t.Errorf("%d records handed on, want %d", got, tt.records)
			}
		})
	}
}

func TestCheckSelf(t *testing.T) {
	self, pgid := os.Getpid(), unix.Getpgrp()
	st := proc.MustStat(t, root, self)
	good := Task{PID: self, PGID: pgid, Threads: st.Threads, StartTicks: st.StartTicks, PPID: st.PPID, UID: os.Getuid()}
	copy(good.comm[:], st.Comm)
	tests := []struct {
		name string
		edit func(*Task)
		ok   bool
	}{
		{"agrees", func(*Task) {}, true},
		{"leader exited, threads live", func(t *Task) { t.ExitState, t.Threads = 16, 3 }, true},
		{"other group", func(t *Task) { t.PGID = pgid + 1 }, false},
		{"no group", func(t *Task) { t.PGID = 0 }, false},
		{"other start", func(t *Task) { t.StartTicks++ }, false},
		{"other comm", func(t *Task) { t.comm[0]++ }, false},
		{"comm cut short", func(t *Task) { t.comm[1] = 0 }, false},
		{"zombie", func(t *Task) { t.ExitState, t.Threads = 16, 1 }, false},
		{"other parent", func(t *Task) { t.PPID++ }, false},
		{"other uid", func(t *Task) { t.UID++ }, false},
		{"uid unknown", func(t *Task) { t.UID = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			me := good
			tt.edit(&me)
			err := checkSelf(&me, self, pgid)
			if tt.ok && err != nil {
				t.Errorf("checkSelf: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrUnavailable) {
				t.Errorf("checkSelf = %v, want ErrUnavailable", err)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		if err := checkSelf(nil, self, pgid); !errors.Is(err, ErrUnavailable) {
			t.Errorf("checkSelf(nil) = %v, want ErrUnavailable", err)
		}
	})
}

// TestTaskZombie checks that Task.Zombie says what fingerprint.Stat.Zombie
// says of the same process, as Each's callers rely on.
func TestTaskZombie(t *testing.T) {
	const exitZombie, exitDead = 32, 16 // EXIT_ZOMBIE, EXIT_DEAD
	tests := []struct {
		exitState uint32
		state     byte
	}{{0, 'S'}, {exitZombie, 'Z'}, {exitDead, 'X'}}
	for _, tt := range tests {
		for _, threads := range []int{0, 1, 2, 40} {
			t.Run(fmt.Sprintf("exit_state %d, %d threads", tt.exitState, threads), func(t *testing.T) {
				task := Task{ExitState: tt.exitState, Threads: threads}
				st := fingerprint.Stat{State: tt.state, Threads: threads}
				if task.Zombie() != st.Zombie() {
					t.Errorf("Task.Zombie = %v, Stat.Zombie = %v", task.Zombie(), st.Zombie())
				}
			})
		}
	}
}

func TestComm(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want string
	}{
		{"padded", "sleep\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "sleep"},
		{"15 bytes", "abcdefghijklmno\x00", "abcdefghijklmno"},
		{"no NUL at all", "abcdefghijklmnop", "abcdefghijklmnop"},
		{"bytes after the NUL", "ab\x00stale_name\x00\x00\x00", "ab"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var task Task
			copy(task.comm[:], tt.raw)
			if got := string(task.Comm()); got != tt.want {
				t.Errorf("Comm = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestProgramReused: a program loaded once serves several passes, at once
// too, each listing this process; once closed it lists nothing.
func TestProgramReused(t *testing.T) {
	p, err := Load()
	if err != nil {
		if Unsupported(err) {
			t.Skipf("task iterator not usable on this host: %v", err)
		}
		t.Fatal(err)
	}
	pass := func() error {
		seen := false
		if _, err := p.Each(func(task *Task) { seen = seen || task.PID == os.Getpid() }); err != nil {
			return err
		}
		if !seen {
			return errors.New("this process is not in the pass")
		}
		return nil
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- pass() }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if err := pass(); err != nil {
		t.Errorf("a pass after the others: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Each(func(*Task) {}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a pass of a closed program: %v, want ErrUnavailable", err)
	}
}

// TestCastReadsTheSame: the program that reads the task through
// bpf_rdonly_cast lists what the one without it does, and a cast the
// kernel refuses (here the ID of a function that is no kfunc) falls back
// to the program without it.
func TestCastReadsTheSame(t *testing.T) {
	if err := checkNamespaces(); err != nil {
		t.Skip(err)
	}
	l, err := readLayout()
	if err != nil {
		t.Skipf("no usable kernel BTF: %v", err)
	}
	if l.rdonlyCast == 0 {
		t.Skip("kernel without bpf_rdonly_cast")
	}
	plain := l
	plain.rdonlyCast, plain.taskStruct = 0, 0
	bogus := l
	bogus.rdonlyCast = l.iterFunc
	if fd, err := load(bogus); err == nil {
		unix.Close(fd)
		t.Fatal("the kernel took a program calling a function that is no kfunc: the fallback below would prove nothing")
	}
	pass := func(l layout, load func(layout) (int, error)) map[int]Task {
		t.Helper()
		fd, err := load(l)
		if err != nil {
			if Unsupported(err) {
				t.Skipf("task iterator not usable on this host: %v", err)
			}
			t.Fatalf("load: %v", err)
		}
		p := &Program{fd: fd}
		defer p.Close()
		return byPID(t, p)
	}
	for _, other := range []struct {
		name string
		l    layout
		load func(layout) (int, error)
	}{{"without", plain, load}, {"fallen back", bogus, loadFor}} {
		sameSteady(t, "with the cast", other.name, func() (map[int]Task, map[int]Task) {
			return pass(l, load), pass(other.l, other.load)
		})
	}
}

// byPID is a pass of p, by PID.
func byPID(t *testing.T, p *Program) map[int]Task {
	t.Helper()
	out := map[int]Task{}
	if _, err := p.Each(func(task *Task) { out[task.PID] = *task }); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameSteady checks that two passes agree field by field on the
// processes steady between them (a process that came, went or changed
// is not compared), that most were, and that this process is in the
// first. A process that execs between the passes keeps its PID and
// start time but not its name, so passes that disagree are taken again,
// and only a process they disagree on in three pairs in a row fails: a
// process execs once between two passes, a wrong read repeats. It
// returns the last pair.
func sameSteady(t *testing.T, aName, bName string, passes func() (a, b map[int]Task)) (map[int]Task, map[int]Task) {
	t.Helper()
	var a, b map[int]Task
	var still map[int]string
	for try := 0; try < 3 && (try == 0 || len(still) > 0); try++ {
		a, b = passes()
		diffs, same := disagreements(aName, a, bName, b)
		if same < len(a)/2 || a[os.Getpid()].PID == 0 {
			t.Fatalf("only %d of %d processes compared; this one in the %s pass: %v", same, len(a), aName, a[os.Getpid()].PID != 0)
		}
		if try > 0 {
			for pid := range diffs {
				if _, ok := still[pid]; !ok {
					delete(diffs, pid)
				}
			}
		}
		still = diffs
	}
	for _, d := range still {
		t.Error(d)
	}
	return a, b
}

// disagreements describes, by PID, the processes steady between passes
// a and b on which they differ, and counts those compared.
func disagreements(aName string, a map[int]Task, bName string, b map[int]Task) (diffs map[int]string, same int) {
	diffs = map[int]string{}
	for pid, x := range a {
		y, ok := b[pid]
		if !ok || x.StartTicks != y.StartTicks || x.Threads != y.Threads || x.ExitState != y.ExitState {
			continue
		}
		if x.PPID == 2 {
			// A workqueue's kworker renames itself as it starts and
			// finishes work ("+kblockd", then "-kblockd").
			x.comm, y.comm = [16]byte{}, [16]byte{}
		}
		if x != y {
			diffs[pid] = fmt.Sprintf("PID %d: %s %+v, %s %+v", pid, aName, x, bName, y)
		}
		same++
	}
	return diffs, same
}

// TestUnsupported: only a host that lacks what the iterator needs is
// unsupported (tests skip, doctor is content); a pass that went wrong
// here, or churn, is not.
func TestUnsupported(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("%w: %w", ErrUnavailable, err) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no privilege", wrap(fmt.Errorf("load: %w", unix.EPERM)), true},
		{"no BTF", wrap(&fs.PathError{Op: "open", Path: "/sys/kernel/btf/vmlinux", Err: fs.ErrNotExist}), true},
		{"no bpf(2)", wrap(unix.ENOSYS), true},
		{"no task iterator", wrap(fmt.Errorf("%w: kernel BTF has no function %s", errNoTaskIter, iterFuncName)), true},
		{"another PID namespace", fmt.Errorf("%w: %w: this process is in another pid namespace", ErrUnavailable, errNamespace), true},
		{"verifier refusal", wrap(fmt.Errorf("load: %w", unix.EACCES)), false},
		{"listing at odds with /proc", fmt.Errorf("%w: the listing disagrees with /proc for this process", ErrUnavailable), false},
		{"churn", fmt.Errorf("%w: %w: a PID was reused during each of 3 walks", ErrUnavailable, ErrChurn), false},
		{"not the iterator's", fmt.Errorf("open: %w", fs.ErrNotExist), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Unsupported(tc.err); got != tc.want {
				t.Errorf("Unsupported(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
