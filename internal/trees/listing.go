package trees

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// ParseComms reads --supervisor-comm, a comma-separated list of process
// names. The kernel truncates comm to 15 bytes, so a longer name could
// never match.
func ParseComms(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if len(p) > 15 {
			return nil, fmt.Errorf("%q is longer than the 15 bytes the kernel keeps of a process name", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process names given")
	}
	return out, nil
}

// minMembersPerWorker: below this many candidate members per goroutine,
// reading them in one is faster.
const minMembersPerWorker = 32

// listGroups lists the host's processes the way opt.Lister asks and
// returns the candidate groups in PGID order, with the scanners to read
// them on (their readers are the caller's to close). A listing still
// pending (proctable.Options.Defer) must be confirmed before the scan
// reports a tree (see Scan).
func listGroups(opt Options, comms map[string]bool, stats *Stats) (*proctable.Listing, []candidate, []*scanner, error) {
	l, err := proctable.List(proctable.Options{
		Root: opt.Root, Lister: opt.Lister, Named: comms, Defer: true,
		Pipeline: opt.pipeline, Hide: opt.iterHide, Watch: opt.Watch, Program: opt.Program,
		LayoutCache: opt.LayoutCache,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	ss := []*scanner{{opt: opt, comms: comms, proc: proctable.NewReader(opt.Root), listing: l}}
	cands := ss[0].candidates(l, stats)
	// The candidates' identities are read from /proc; spread them.
	members := 0
	for _, c := range cands {
		members += len(c.pids)
	}
	for w := 1; w < runtime.GOMAXPROCS(0) && members >= 2*w*minMembersPerWorker; w++ {
		ss = append(ss, &scanner{opt: opt, comms: comms, proc: proctable.NewReader(opt.Root), listing: l})
	}
	return l, cands, ss, nil
}

// leaderAt is a group leader as the listing saw it, decided.
type leaderAt struct {
	pid  int
	mark leaderMark
}

// mark decides a leader from what the listing saw of it.
func (s *scanner) mark(l proctable.Leader) leaderMark {
	switch l.State {
	case proctable.Unreadable:
		return unreadableLeader
	case proctable.Live:
		// The listing sets Comm for a leader in the supervisor set
		// only: the others, nearly all, need no lookup.
		if l.Comm == WrapperComm && !slices.Contains(s.opt.Comms, WrapperComm) {
			return leaderMark{live: true, sup: true, wrapper: true}
		}
		return leaderMark{live: true, sup: l.Comm != "" && s.supervisor(l.PID, l.Comm, nil)}
	}
	return leaderMark{}
}

// candidates gathers the groups of l that are not settled by their leader
// alone: those a live supervisor leads, and those whose leader is gone, a
// zombie or elsewhere. A group led by a live process outside the
// supervisor set is never ours to signal (see examine) and is dropped here.
func (s *scanner) candidates(l *proctable.Listing, stats *Stats) []candidate {
	listingStats(l, stats)
	leaders := make([]leaderAt, len(l.Leaders))
	for i, ld := range l.Leaders {
		leaders[i] = leaderAt{pid: ld.PID, mark: s.mark(ld)}
	}
	byPID := func(a, b leaderAt) int { return a.pid - b.pid }
	if !slices.IsSortedFunc(leaders, byPID) {
		slices.SortStableFunc(leaders, byPID)
	}
	// The groups settled by their live leader, as a bitset indexed by
	// PGID: every process of the host is looked up in it.
	settled, maxPID := 0, 0
	if n := len(leaders); n > 0 {
		maxPID = leaders[n-1].pid
	}
	settledSet := make([]uint64, maxPID/64+1)
	for _, l := range leaders {
		if l.mark.live && !l.mark.sup {
			settled++
			settledSet[l.pid/64] |= 1 << (l.pid % 64)
		}
	}

	type member struct {
		pgid, pid, i int
		start        uint64
	}
	var open []member
	for i, pgid32 := range l.PGIDs {
		pgid := int(pgid32)
		if pgid <= 0 {
			continue // gone, or a kernel thread
		}
		if pgid <= maxPID && settledSet[pgid/64]&(1<<(pgid%64)) != 0 {
			continue
		}
		m := member{pgid: pgid, pid: l.PIDs[i], i: i}
		if l.Starts != nil {
			m.start = l.Starts[i]
		}
		open = append(open, m)
	}
	// Stable: members stay in listing order, as the full scan has them.
	slices.SortStableFunc(open, func(a, b member) int { return a.pgid - b.pgid })

	var cands []candidate
	for i := 0; i < len(open); {
		c := candidate{pgid: open[i].pgid}
		for ; i < len(open) && open[i].pgid == c.pgid; i++ {
			c.pids = append(c.pids, open[i].pid)
			c.starts = append(c.starts, open[i].start)
			c.at = append(c.at, open[i].i)
		}
		if j, ok := slices.BinarySearchFunc(leaders, c.pgid, func(l leaderAt, pgid int) int { return l.pid - pgid }); ok {
			c.leader, c.listed = leaders[j].mark, true
		}
		cands = append(cands, c)
	}
	stats.Groups = settled + len(cands)
	return cands
}

// listingStats copies what the listing reports into stats.
func listingStats(l *proctable.Listing, stats *Stats) {
	stats.Lister, stats.ListerFallback = l.Lister, l.Fallback
	stats.IterConfirmed, stats.IterMissed = l.Confirmed, l.Missed
	stats.Processes = len(l.PIDs)
}
