package trees

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proclist"
	"github.com/kc-watchman/kc-watchman/internal/taskiter"
)

// Lister chooses how the fast scan lists the host's processes. Either way
// the decisions are the same: the listing only settles which groups are
// candidates, and candidates are read from /proc.
type Lister int

const (
	// ListAuto uses the BPF task iterator where the kernel and the
	// caller's privileges allow it, and /proc otherwise.
	ListAuto Lister = iota
	// ListProc lists /proc: a getpgid(2) per process and a stat read per
	// group leader. It never loads a BPF program.
	ListProc
	// ListBPF requires the BPF task iterator: the scan fails without it.
	ListBPF
)

// ParseLister reads the --bpf setting: auto, on (ListBPF) or off
// (ListProc).
func ParseLister(s string) (Lister, error) {
	switch s {
	case "auto":
		return ListAuto, nil
	case "off":
		return ListProc, nil
	case "on":
		return ListBPF, nil
	}
	return ListAuto, fmt.Errorf("%q is not auto, on or off", s)
}

// String returns the --bpf spelling of l.
func (l Lister) String() string {
	switch l {
	case ListProc:
		return "off"
	case ListBPF:
		return "on"
	}
	return "auto"
}

// errNoIterator wraps why a ListBPF scan could not list.
var errNoIterator = errors.New("the BPF task iterator was required")

// iterGroups is the first pass of the fast scan done by the BPF task
// iterator: every process's group and every leader's state and comm in
// one stream, with no file read. It decides leaders exactly as
// scanner.leader does from a stat read.
//
// The iterator is not trusted to list every process: it has been seen to
// leave some out (PID 1 on this project's VMs), and a member it missed
// would be missing from the decisions about its group (a second
// container's ID, another UID, a younger age). Unless the pass's census
// proves that every process was listed (see vouch), Scan runs the returned
// confirmation: it lists /proc and adds every process /proc shows that the
// iterator did not, so that any process that exists for the whole scan is
// in it, as with the /proc lister, and returns the candidates anew when an
// added process is in a group.
func iterGroups(opt Options, comms map[string]bool, stats *Stats) ([]candidate, []*scanner, *confirmation, error) {
	s := &scanner{opt: opt, comms: comms, proc: newProcReader(opt.Root)}
	ss := []*scanner{s}
	b := &batch{}
	tasks, sawInit := 0, false
	census, err := taskiter.Each(func(t *taskiter.Task) {
		if opt.iterHide != nil && opt.iterHide(t.PID) {
			return
		}
		tasks += t.Threads
		sawInit = sawInit || t.PID == 1
		b.pids = append(b.pids, t.PID)
		b.pgids = append(b.pgids, int32(t.PGID))
		b.starts = append(b.starts, t.StartTicks)
		if t.PGID != t.PID {
			return
		}
		var mark leaderMark
		if !t.Zombie() {
			mark.live = true
			// Indexing the map with the converted bytes does not
			// allocate; only a supervisor's comm becomes a string.
			if comm := t.Comm(); comms[string(comm)] {
				mark.sup = s.supervisor(t.PID, string(comm), nil)
			}
		}
		b.leaders = append(b.leaders, leaderAt{pid: t.PID, mark: mark})
	})
	if err != nil {
		return nil, ss, nil, err
	}
	listed := len(b.pids)
	complete := s.vouch(b, &census, tasks, sawInit)
	stats.IterMissed = len(b.pids) - listed
	stats.Processes = len(b.pids)
	cands := candidates([]*batch{b}, stats)
	// The candidates' identities are read from /proc; spread them.
	members := 0
	for _, c := range cands {
		members += len(c.pids)
	}
	for w := 1; w < runtime.GOMAXPROCS(0) && members >= 2*w*minMembersPerWorker; w++ {
		ss = append(ss, &scanner{opt: opt, comms: comms, proc: newProcReader(opt.Root)})
	}
	if complete {
		return cands, ss, nil, nil
	}
	return cands, ss, &confirmation{s: s, b: b, cands: cands, stats: stats}, nil
}

// vouch reports whether the pass's census proves that b lists every
// process, tasks being the sum of the listed processes' threads. The one
// process the iterator is known to leave out, PID 1 (on this project's
// VMs), is read from /proc when missing and added to b if that accounts
// for every unlisted task. The census is re-read after that read, so that
// a change to the process table meanwhile cannot pass for the proof.
func (s *scanner) vouch(b *batch, census *taskiter.Census, tasks int, sawInit bool) bool {
	var init fingerprint.Stat
	probed := false
	// PID 1 by name: on this project's 6.18 Firecracker VMs the kernel
	// withholds PID 1's whole thread group from task iterators, as it
	// shields it from ptrace-mode access, and nothing else
	// (docs/LISTING.md). Reading it here lets the census vouch for such a
	// pass; any other absence still fails the census below.
	if !sawInit {
		st, err := s.proc.stat(1)
		if err != nil {
			return false
		}
		init, probed = st, true
		tasks += st.Threads
	}
	if err := census.Recheck(); err != nil {
		return false
	}
	if n, exact := census.Unlisted(tasks); !exact || n != 0 {
		return false
	}
	if probed {
		b.pids = append(b.pids, 1)
		b.pgids = append(b.pgids, int32(init.PGID))
		b.starts = append(b.starts, 0)
		if init.PGID == 1 {
			b.leaders = append(b.leaders, leaderAt{pid: 1, mark: s.leader(1)})
		}
	}
	return true
}

// confirmation checks the task iterator's listing against /proc's. The
// listing of /proc may start early (start) and run while the candidates
// are examined; finish waits for it and merges.
type confirmation struct {
	s     *scanner
	b     *batch
	cands []candidate
	stats *Stats

	done   chan struct{}
	listed []int
	err    error
}

func (c *confirmation) start() {
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.listed, c.err = proclist.List(c.s.opt.Root)
	}()
}

// finish adds what /proc listed and the iterator did not, and returns the
// candidates anew (changed) if an added process is in a group.
func (c *confirmation) finish() (cands []candidate, changed bool, err error) {
	if c.done == nil {
		c.start()
	}
	<-c.done
	if c.err != nil {
		return nil, false, c.err
	}
	c.stats.IterConfirmed = true
	missed, grouped := c.s.addMissed(c.b, c.listed)
	c.stats.IterMissed = missed
	c.stats.Processes = len(c.b.pids)
	if grouped == 0 {
		return c.cands, false, nil
	}
	return candidates([]*batch{c.b}, c.stats), true, nil
}

// addMissed adds to b the processes of listed (ascending, as /proc lists
// them) that the iterator's listing (ascending too) does not have. It
// returns how many it added, and how many of those are in a process group
// (PID 1 and kernel threads are in none, and a process gone since is in
// none any more: they change no decision).
func (s *scanner) addMissed(b *batch, listed []int) (missed, grouped int) {
	seen := b.pids // the iterator's, before anything is appended
	if !slices.IsSorted(seen) {
		seen = slices.Sorted(slices.Values(seen))
	}
	j := 0
	for _, pid := range listed {
		for j < len(seen) && seen[j] < pid {
			j++
		}
		if j < len(seen) && seen[j] == pid {
			continue
		}
		missed++
		pgid := -1
		if r, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pid), 0, 0); errno == 0 {
			pgid = int(r)
		}
		if pgid > 0 {
			grouped++
		}
		b.pids = append(b.pids, pid)
		b.pgids = append(b.pgids, int32(pgid))
		b.starts = append(b.starts, 0)
		if pgid == pid {
			b.leaders = append(b.leaders, leaderAt{pid: pid, mark: s.leader(pid)})
		}
	}
	return missed, grouped
}

// minMembersPerWorker: below this many candidate members per goroutine,
// reading them in one is faster.
const minMembersPerWorker = 32

// listGroups runs the first pass the way opt.Lister asks. confirm, when
// not nil, must run before the scan reports a tree (see iterGroups).
func listGroups(opt Options, comms map[string]bool, stats *Stats) (cands []candidate, ss []*scanner, confirm *confirmation, err error) {
	if opt.Lister != ListProc && opt.Root == fingerprint.DefaultRoot {
		cands, ss, confirm, err := iterGroups(opt, comms, stats)
		if err == nil {
			stats.Lister = "bpf"
			return cands, ss, confirm, nil
		}
		for _, s := range ss {
			s.proc.close()
		}
		if opt.Lister == ListBPF {
			return nil, nil, nil, fmt.Errorf("%w: %w", errNoIterator, err)
		}
		stats.ListerFallback = err.Error()
	} else if opt.Lister == ListBPF {
		return nil, nil, nil, fmt.Errorf("%w: it lists only the host's /proc, not %s", errNoIterator, opt.Root)
	}
	stats.Lister = "proc"
	cands, ss, err = fastGroups(opt, comms, stats)
	return cands, ss, nil, err
}
