// Package taskiter lists the host's processes through BPF: a small
// program that records each process's ID, process group, exit state,
// thread count, start time, comm, parent and real UID. Listing /proc
// costs a getdents(2) share, a getpgid(2) and, for a group leader, an
// openat/read/close per process; on a host with tens of thousands of
// processes, and on virtual machines where each system call is dear, that
// is most of a scan's time.
//
// Where the kernel has the open-coded task iterator (Linux 6.7), the
// program walks the kernel's process list itself, in one run, into a map
// this process reads in place (walk.go); elsewhere it is a task iterator
// program, which the kernel runs once per task, writing into one stream
// read with a few read(2) calls. The walk takes half the time: the task
// iterator looks each task up by PID.
//
// The program is built here, at run time, from the kernel's own BTF (so no
// compiler and no object file are involved) and lives only while Each
// runs. It needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), a kernel with
// BTF and task iterators (5.8 or later), and a caller in the host's PID
// and time namespaces, whose numbers it reports; where any of that is
// missing, Each fails with an error wrapping ErrUnavailable and callers
// list /proc instead.
//
// The listing is not to be staked a signal on as it comes. The kernel's
// iterators have been seen to leave out a live process (PID 1 and its
// threads, on this project's Linux 6.18 Firecracker VMs, whose kernel
// shields its init from both; /proc shows it), and Each's closing
// self-check cannot notice an absence. Each returns a Census for that:
// the listed processes' threads add up to the kernel's task count, in a
// pass during which no task was created or went away, only if no process
// was left out. Where the census cannot vouch, callers list /proc too
// (package proctable, which lists with this package, does; package trees
// reads the stat of every group leader the listing did not show before
// calling a group leaderless). DESIGN "PID 1 and the iterator" has what
// is known of the PID 1 case, and DESIGN "Why the iterator is
// hand-written, not cilium/ebpf" why the program is hand-written.
package taskiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// ErrUnavailable wraps every reason the iterator cannot be used here.
var ErrUnavailable = errors.New("BPF task iterator unavailable")

// ErrChurn, with ErrUnavailable, says that processes came and went too
// fast for a pass to list them (PIDs reused, the host outgrowing the
// walk's map): a pass of a moment later may succeed, and nothing is said
// against the layout the program was built from.
var ErrChurn = errors.New("processes changed too fast to list")

// Unsupported reports whether err says only that this host cannot run
// the iterator — no privilege, no BTF, no bpf(2), no task iterator, not
// the host's namespaces — rather than that a pass went wrong here (a
// verifier's refusal, a listing that disagrees with /proc, churn). The
// former is a fact of the host; the latter is worth an operator's look,
// and a test's failure.
func Unsupported(err error) bool {
	return errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrChurn) &&
		(errors.Is(err, unix.EPERM) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOSYS) ||
			errors.Is(err, errNamespace) || errors.Is(err, errNoTaskIter))
}

// errNoTaskIter is a kernel without task iterators (before 5.8).
var errNoTaskIter = errors.New("kernel without task iterators")

// Task is one process (thread-group leader) as the kernel saw it.
type Task struct {
	PID  int
	PGID int // 0 for kernel threads
	// ExitState is task->exit_state: non-zero once the thread-group
	// leader has exited.
	ExitState uint32
	// Threads is the process's live thread count (num_threads in stat).
	Threads    int
	StartTicks uint64
	// PPID is the real parent's PID (0 for none: PID 1, kthreadd).
	PPID int
	// UID is the real UID in the host's user namespace, -1 if unknown.
	UID  int
	comm [16]byte
}

// Comm returns the task's comm, without the NUL padding; the slice is
// only valid during the call to the Each callback.
func (t *Task) Comm() []byte {
	c := t.comm[:]
	if i := bytes.IndexByte(c, 0); i >= 0 {
		c = c[:i]
	}
	return c
}

// Zombie reports what fingerprint.Stat.Zombie reports for the same
// process: its leader has exited and no other thread keeps it alive.
func (t *Task) Zombie() bool { return t.ExitState != 0 && t.Threads <= 1 }

// Inode numbers of the initial PID and time namespaces
// (include/linux/proc_ns.h): fixed, on every boot.
const (
	initPIDNSIno  = 0xEFFFFFFC
	initTimeNSIno = 0xEFFFFFFA
)

// nsPerTick converts start_boottime to the clock ticks of /proc/<pid>/stat
// (USER_HZ = 100, as fingerprint and trees assume).
const nsPerTick = 1_000_000_000 / 100

// Census is what a pass can tell about its own completeness.
type Census struct {
	// TasksBefore and TasksAfter are the kernel's count of tasks
	// (nr_threads, in /proc/loadavg) just before and just after the
	// pass; ForksBefore and ForksAfter its count of tasks ever created
	// ("processes" in /proc/stat), which it raises in the same step as
	// the task count, threads and clone3's chosen PIDs included.
	TasksBefore, TasksAfter int
	ForksBefore, ForksAfter uint64
}

// Unlisted returns how many tasks belong to processes the pass did not
// list, given the tasks of those it did (the sum of their Threads), and
// whether that count is exact. Every task belongs to one process, whose
// Threads counts it, so the kernel's task count minus the listed
// processes' is what the unlisted ones hold: zero when every process was
// listed. It is exact for a pass during which no task was created (the
// fork count unchanged) and, then, none went away (the task count
// unchanged). A PID handed out is no proof of that: the kernel hands it
// out well before it counts the task, so a fork begun before the pass
// could be counted during it, and offset a task gone.
func (c Census) Unlisted(listedTasks int) (int, bool) {
	if c.ForksBefore != c.ForksAfter || c.TasksBefore != c.TasksAfter || listedTasks > c.TasksBefore {
		return 0, false
	}
	return c.TasksBefore - listedTasks, true
}

// Recheck reads the kernel's counts again as the pass's "after": a
// caller that reads more of the process table after the pass (a process
// the pass did not list) extends the window the census vouches for to
// those reads.
func (c *Census) Recheck() error {
	var err error
	c.TasksAfter, c.ForksAfter, err = readCounts(false)
	return err
}

// readCounts reads the task count and the fork count. Before a pass the
// fork count is read first, after it last: a fork completed in between
// shows in the fork count even if the task count read missed it.
func readCounts(before bool) (tasks int, forks uint64, err error) {
	if before {
		if forks, err = readForks(); err == nil {
			tasks, err = readLoadavg()
		}
		return tasks, forks, err
	}
	if tasks, err = readLoadavg(); err == nil {
		forks, err = readForks()
	}
	return tasks, forks, err
}

// Program is the iterator program, loaded into the kernel for passes
// until Close. Loading costs most of a small host's pass (the kernel's
// BTF read and the verifier: several milliseconds), so a long-running
// caller (watch) loads it once. Passes may run at once.
//
// Where the kernel has the open-coded task iterator, the program is the
// walk (walk.go), whose passes take their turn, since they share its
// map; elsewhere it is the task iterator program, of which each pass
// attaches its own instance and which keeps no state between tasks.
type Program struct {
	fd int     // the task iterator program, -1 when w is used
	w  *walker // the walk, nil where the kernel has none
	// cache is the file the layout was read from (LoadCached), removed
	// when a pass disagrees with /proc.
	cache string
	// walkErr is why a kernel that lists the walk's kfuncs did not take
	// the walk.
	walkErr error
}

// Load builds the program from the kernel's BTF and loads it. Errors wrap
// ErrUnavailable.
func Load() (*Program, error) {
	if err := checkNamespaces(); err != nil {
		return nil, err
	}
	l, err := readLayout()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return loadLayout(l)
}

// loadLayout loads the program for layout l.
func loadLayout(l layout) (*Program, error) {
	var walkErr error
	if l.walkNew != 0 {
		// A kernel that lists the kfuncs but will not take the walk
		// (a verifier older or stricter than the one it was written
		// for) gets the task iterator program.
		w, err := newWalker(l)
		if err == nil {
			return &Program{fd: -1, w: w}, nil
		}
		walkErr = err
	}
	fd, err := loadFor(l)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return &Program{fd: fd, walkErr: walkErr}, nil
}

// loadFor loads the program for layout l. A kernel that lists the cast
// kfunc but does not offer it to iterators gets the program without it.
func loadFor(l layout) (int, error) {
	fd, err := load(l)
	if err != nil && l.rdonlyCast != 0 {
		l.rdonlyCast, l.taskStruct = 0, 0
		fd, err = load(l)
	}
	return fd, err
}

func load(l layout) (int, error) {
	prog, err := program(l)
	if err != nil {
		return -1, err
	}
	return loadProgram(prog, l.iterFunc)
}

// Method says how the program lists, for operators: "walk of the process
// list", or "task iterator" and why not the walk where the kernel lists
// its kfuncs.
func (p *Program) Method() string {
	switch {
	case p.w != nil:
		return "walk of the process list"
	case p.walkErr != nil:
		return fmt.Sprintf("task iterator (the walk was refused: %v)", p.walkErr)
	}
	return "task iterator"
}

// Walks reports whether the program is the walk, whose pass is cheap
// enough to run again rather than confirm a listing some other way.
func (p *Program) Walks() bool { return p.w != nil }

// Close unloads the program.
func (p *Program) Close() error {
	if p == nil {
		return nil
	}
	if p.w != nil {
		p.w.close() // a pass after it fails: its fd is gone
	}
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// Each loads the program, runs one pass and unloads it (Program.Each).
func Each(fn func(*Task)) (Census, error) {
	p, err := Load()
	if err != nil {
		return Census{}, err
	}
	defer p.Close()
	return p.Each(fn)
}

// Each runs one pass of the iterator and calls fn for every process of the
// host, in ascending PID order. If Each returns an error, what fn was
// given must be thrown away. The pass ends with a check of this very
// process's record against getpgrp(2) and /proc/self/stat (group, start
// time, comm, alive, some thread): a layout gone wrong in one of those
// fields fails it.
func (p *Program) Each(fn func(*Task)) (Census, error) {
	var census Census
	if p == nil || (p.fd < 0 && p.w == nil) {
		return census, fmt.Errorf("%w: the program is not loaded", ErrUnavailable)
	}
	// The namespaces are checked again: the program reports the initial
	// namespaces' numbers, and a caller may have moved since Load.
	if err := checkNamespaces(); err != nil {
		return census, err
	}
	census, err := p.pass(fn)
	p.judgeCache(err)
	return census, err
}

// judgeCache removes the file the layout came from when a pass's error
// speaks against the layout: the next load reads the kernel's BTF again.
// Churn does not.
func (p *Program) judgeCache(err error) {
	if err != nil && p.cache != "" && !errors.Is(err, ErrChurn) {
		os.Remove(p.cache)
	}
}

func (p *Program) pass(fn func(*Task)) (Census, error) {
	var census Census
	if p.w != nil {
		return p.w.each(fn)
	}
	fd, err := openIter(p.fd, 0)
	if err != nil {
		return census, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer unix.Close(fd)

	ls := newLister(fn)
	census.TasksBefore, census.ForksBefore, err = readCounts(true)
	if err != nil {
		return census, err
	}
	if err := readRecords(fd, ls.record); err != nil {
		return census, err
	}
	return ls.finish(census)
}

// lister hands a pass's records to the caller's function as Tasks and
// checks them on the way: in ascending PID order, each PID once, this
// process among them and as /proc sees it.
type lister struct {
	fn         func(*Task)
	self, pgid int
	me         *Task
	t          Task
	last       int
	order      error
}

func newLister(fn func(*Task)) *lister {
	return &lister{fn: fn, self: os.Getpid(), pgid: unix.Getpgrp()}
}

func (ls *lister) record(rec []byte) {
	t := &ls.t
	*t = Task{
		PID:        int(binary.NativeEndian.Uint32(rec[0:])),
		PGID:       int(binary.NativeEndian.Uint32(rec[4:])),
		ExitState:  binary.NativeEndian.Uint32(rec[8:]),
		Threads:    int(binary.NativeEndian.Uint32(rec[12:])),
		StartTicks: binary.NativeEndian.Uint64(rec[16:]) / nsPerTick,
		PPID:       int(binary.NativeEndian.Uint32(rec[40:])),
		UID:        -1,
	}
	if uid := binary.NativeEndian.Uint32(rec[44:]); uid != 1<<32-1 {
		t.UID = int(uid)
	}
	// A PID twice, or out of order, would count its threads twice
	// in the census; the pass is then not to be trusted.
	if t.PID <= ls.last && ls.order == nil {
		ls.order = fmt.Errorf("%w: the iterator listed PID %d after %d", ErrUnavailable, t.PID, ls.last)
	}
	ls.last = t.PID
	copy(t.comm[:], rec[24:40])
	if t.PID == ls.self {
		c := *t
		ls.me = &c
	}
	ls.fn(t)
}

// finish closes the census and checks the pass as a whole.
func (ls *lister) finish(census Census) (Census, error) {
	if ls.order != nil {
		return census, ls.order
	}
	var err error
	if census.TasksAfter, census.ForksAfter, err = readCounts(false); err != nil {
		return census, err
	}
	return census, checkSelf(ls.me, ls.self, ls.pgid)
}

// TaskCount returns the kernel's count of tasks (threads included), from
// /proc/loadavg: what the processes cannot outnumber.
func TaskCount() (int, error) { return readLoadavg() }

// readLoadavg returns the kernel's task count, from /proc/loadavg.
func readLoadavg() (int, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("task census: %w", err)
	}
	return parseLoadavg(data)
}

// parseLoadavg reads the task count: the total of the fourth field,
// running/total ("0.20 0.18 0.12 1/80 11206").
func parseLoadavg(data []byte) (int, error) {
	f := strings.Fields(string(data))
	if len(f) == 5 {
		if _, total, ok := strings.Cut(f[3], "/"); ok {
			if tasks, err := strconv.Atoi(total); err == nil && tasks > 0 {
				return tasks, nil
			}
		}
	}
	return 0, fmt.Errorf("task census: unexpected /proc/loadavg %q", data)
}

// readForks returns the kernel's count of tasks ever created, from
// /proc/stat.
func readForks() (uint64, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("task census: %w", err)
	}
	return parseForks(data)
}

// parseForks finds the "processes N" line of /proc/stat.
func parseForks(data []byte) (uint64, error) {
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(line, []byte("processes ")); ok {
			if n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64); err == nil {
				return n, nil
			}
		}
	}
	return 0, errors.New("task census: no processes line in /proc/stat")
}

// readRecords reads the iterator to its end and hands on whole records;
// a read(2) may end inside one.
func readRecords(fd int, fn func([]byte)) error {
	// The kernel fills at most one seq_file buffer (8 pages) per read.
	buf := make([]byte, 32<<10)
	have := 0
	for {
		n, err := unix.Read(fd, buf[have:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read task iterator: %w", err)
		}
		if n == 0 {
			if have != 0 {
				return fmt.Errorf("read task iterator: %d bytes left over (record size mismatch)", have)
			}
			return nil
		}
		have += n
		whole := have - have%recordSize
		for off := 0; off < whole; off += recordSize {
			fn(buf[off : off+recordSize])
		}
		have = copy(buf, buf[whole:have])
	}
}

// errNamespace is a caller outside the host's PID or time namespace.
var errNamespace = errors.New("caller outside the host's namespaces")

// checkNamespaces refuses callers outside the initial PID and time
// namespaces: the program reports the initial namespaces' PIDs and an
// unshifted boot clock.
func checkNamespaces() error {
	for _, ns := range []struct {
		name string
		ino  uint64
	}{{"pid", initPIDNSIno}, {"time", initTimeNSIno}} {
		var st unix.Stat_t
		err := unix.Stat("/proc/self/ns/"+ns.name, &st)
		if errors.Is(err, unix.ENOENT) && ns.name == "time" {
			continue // a kernel without time namespaces
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if st.Ino != ns.ino {
			return fmt.Errorf("%w: %w: this process is in another %s namespace", ErrUnavailable, errNamespace, ns.name)
		}
	}
	return nil
}

// checkSelf compares the iterator's record of this process with what
// getpgrp(2) and /proc/self/stat say.
func checkSelf(me *Task, self, pgid int) error {
	if me == nil {
		return fmt.Errorf("%w: this process (%d) is missing from the listing", ErrUnavailable, self)
	}
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, self)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// The thread count may have changed since the pass (the Go runtime
	// starts threads as it likes), but a live process has one at least.
	// The caller is in the host's PID namespace (checkNamespaces), and
	// only the host's user namespace holds CAP_BPF: its real UID is the
	// kernel's.
	if me.PGID != pgid || me.StartTicks != st.StartTicks || string(me.Comm()) != st.Comm || me.Zombie() || me.Threads < 1 ||
		me.PPID != st.PPID || me.UID != os.Getuid() {
		return fmt.Errorf("%w: the listing disagrees with /proc for this process: pgid %d, start %d, comm %q, zombie %v, %d threads, ppid %d, uid %d (want %d, %d, %q, alive, at least 1, %d, %d)",
			ErrUnavailable, me.PGID, me.StartTicks, me.Comm(), me.Zombie(), me.Threads, me.PPID, me.UID, pgid, st.StartTicks, st.Comm, st.PPID, os.Getuid())
	}
	return nil
}
