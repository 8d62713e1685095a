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
// leave one out (PID 1 on this project's VMs), and a member it missed
// would be missing from the decisions about its group (a second
// container's ID, another UID, a younger age). So /proc's own listing
// runs alongside, on another CPU, and every process it shows that the
// iterator did not is added through getpgid(2) and, if it leads its
// group, a stat read: any process that exists for the whole scan is in
// it, as with the /proc lister.
func iterGroups(opt Options, comms map[string]bool, stats *Stats) ([]candidate, []*scanner, error) {
	s := &scanner{opt: opt, comms: comms, proc: newProcReader(opt.Root)}
	ss := []*scanner{s}
	var (
		listed  []int
		listErr error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		listed, listErr = proclist.List(opt.Root)
	}()
	b := &batch{}
	_, err := taskiter.Each(func(t *taskiter.Task) {
		if opt.iterHide != nil && opt.iterHide(t.PID) {
			return
		}
		b.pids = append(b.pids, t.PID)
		b.pgids = append(b.pgids, int32(t.PGID))
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
	<-done
	if err != nil {
		return nil, ss, err
	}
	if listErr != nil {
		return nil, ss, listErr
	}
	stats.IterMissed = s.addMissed(b, listed)
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
	return cands, ss, nil
}

// addMissed adds to b the processes of listed (ascending, as /proc lists
// them) that the iterator's listing (ascending too) does not have, and
// returns how many it added.
func (s *scanner) addMissed(b *batch, listed []int) int {
	seen := b.pids // the iterator's, before anything is appended
	if !slices.IsSorted(seen) {
		seen = slices.Sorted(slices.Values(seen))
	}
	missed, j := 0, 0
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
		b.pids = append(b.pids, pid)
		b.pgids = append(b.pgids, int32(pgid))
		if pgid == pid {
			b.leaders = append(b.leaders, leaderAt{pid: pid, mark: s.leader(pid)})
		}
	}
	return missed
}

// minMembersPerWorker: below this many candidate members per goroutine,
// reading them in one is faster.
const minMembersPerWorker = 32

// listGroups runs the first pass the way opt.Lister asks.
func listGroups(opt Options, comms map[string]bool, stats *Stats) ([]candidate, []*scanner, error) {
	if opt.Lister != ListProc && opt.Root == fingerprint.DefaultRoot {
		cands, ss, err := iterGroups(opt, comms, stats)
		if err == nil {
			stats.Lister = "bpf"
			return cands, ss, nil
		}
		for _, s := range ss {
			s.proc.close()
		}
		if opt.Lister == ListBPF {
			return nil, nil, fmt.Errorf("%w: %w", errNoIterator, err)
		}
		stats.ListerFallback = err.Error()
	} else if opt.Lister == ListBPF {
		return nil, nil, fmt.Errorf("%w: it lists only the host's /proc, not %s", errNoIterator, opt.Root)
	}
	stats.Lister = "proc"
	return fastGroups(opt, comms, stats)
}
