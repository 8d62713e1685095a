package trees

import (
	"errors"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proclist"
)

// The fast scan makes one pass over /proc in which every process costs a
// getpgid(2) and every group leader a stat read, and after which only the
// candidate groups (a live supervisor leads them, or their leader is gone)
// are read again. Nearly all of its time is system calls, so the pass is a
// pipeline spread over the CPUs: one goroutine lists /proc in small
// batches and hands each batch on while it lists the next, and every
// goroutine, the lister too once it is done, asks for the groups of a
// batch and reads the stat of the leaders in it. A leader is decided as
// soon as it is seen: nothing waits for the whole list.

// batchBytes sizes each getdents64(2) call of the fast scan: about 500
// processes, small enough that the other CPUs start early and share the
// work evenly, large enough that the calls do not add up.
const batchBytes = 16 << 10

// minPIDsPerWorker: below this many processes per CPU, one goroutine is
// faster than several.
const minPIDsPerWorker = 1000

// pipelineTuning overrides batchBytes, minPIDsPerWorker and the number of
// goroutines (GOMAXPROCS) where not zero.
type pipelineTuning struct {
	batchBytes, minPIDsPerWorker, workers int
}

// batch is one getdents64(2) call's worth of processes and what the
// first pass learned about them.
type batch struct {
	pids  []int
	pgids []int32 // -1: gone, 0: kernel thread
	// starts are the start times the listing saw (the task iterator's),
	// 0 where unknown; nil for a /proc listing.
	starts []uint64
	// leaders of groups, in listing order: pids whose pgid is their own.
	leaders []leaderAt
}

type leaderAt struct {
	pid  int
	mark leaderMark
}

// fastGroups runs the first pass and returns the candidate groups in PGID
// order, with one scanner per goroutine it used (their readers are the
// caller's to close).
func fastGroups(opt Options, comms map[string]bool, stats *Stats) ([]candidate, []*scanner, error) {
	newScanner := func() *scanner {
		return &scanner{opt: opt, comms: comms, proc: newProcReader(opt.Root)}
	}
	bufSize, perWorker, maxWorkers := batchBytes, minPIDsPerWorker, runtime.GOMAXPROCS(0)
	if t := opt.pipeline; t.batchBytes > 0 {
		bufSize = t.batchBytes
	}
	if t := opt.pipeline; t.minPIDsPerWorker > 0 {
		perWorker = t.minPIDsPerWorker
	}
	if t := opt.pipeline; t.workers > 0 {
		maxWorkers = t.workers
	}
	ss := []*scanner{newScanner()}
	l, err := proclist.Open(opt.Root, bufSize)
	if err != nil {
		return nil, ss, err
	}
	defer l.Close()

	queue := make(chan *batch, 64)
	var (
		batches []*batch
		wg      sync.WaitGroup
		listed  int
	)
	work := func(s *scanner) {
		for b := range queue {
			s.firstPass(b)
		}
	}
	var listErr error
	for {
		// A dirent for a PID takes at least 24 bytes.
		b := &batch{pids: make([]int, 0, bufSize/24)}
		var done bool
		if b.pids, done, listErr = l.Next(b.pids); listErr != nil || done {
			break
		}
		batches = append(batches, b)
		listed += len(b.pids)
		if len(ss) < maxWorkers && listed >= len(ss)*perWorker {
			s := newScanner()
			ss = append(ss, s)
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(s)
			}()
		}
		select {
		case queue <- b:
		default:
			// Every other goroutine is busy and the queue is full:
			// doing the batch here costs nothing in waiting.
			ss[0].firstPass(b)
		}
	}
	close(queue)
	work(ss[0])
	wg.Wait()
	if listErr != nil {
		return nil, ss, listErr
	}
	stats.Processes = listed
	return candidates(batches, stats), ss, nil
}

// firstPass finds the group of every process of b and decides its
// leaders. On the host's /proc it asks getpgid(2), which never blocks (a
// raw call spares the scheduler hand-off, which costs more than the
// call); another procfs root (test fixtures) has its stat files read.
func (s *scanner) firstPass(b *batch) {
	b.pgids = make([]int32, len(b.pids))
	host := s.opt.Root == fingerprint.DefaultRoot
	for i, pid := range b.pids {
		pgid := -1
		if host {
			if r, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pid), 0, 0); errno == 0 {
				pgid = int(r)
			}
		} else if st, err := s.readStat(pid); err == nil {
			pgid = st.PGID
		} else if !errors.Is(err, fingerprint.ErrNotFound) {
			// Its group is unknown; if it leads one, that group must
			// not look leaderless (see unreadableLeader).
			b.leaders = append(b.leaders, leaderAt{pid: pid, mark: unreadableLeader})
		}
		b.pgids[i] = int32(pgid)
		if pgid == pid {
			b.leaders = append(b.leaders, leaderAt{pid: pid, mark: s.leader(pid)})
		}
	}
}

// candidates gathers the groups that are not settled by their leader
// alone: those a live supervisor leads, and those whose leader is gone, a
// zombie or elsewhere. A group led by a live process outside the
// supervisor set is never ours to signal (see examine) and is dropped here.
func candidates(batches []*batch, stats *Stats) []candidate {
	var leaders []leaderAt
	for _, b := range batches {
		leaders = append(leaders, b.leaders...)
	}
	byPID := func(a, b leaderAt) int { return a.pid - b.pid }
	if !slices.IsSortedFunc(leaders, byPID) {
		slices.SortStableFunc(leaders, byPID)
	}
	settled := 0
	for _, l := range leaders {
		if l.mark.live && !l.mark.sup {
			settled++
		}
	}

	type member struct {
		pgid, pid int
		start     uint64
	}
	var open []member
	for _, b := range batches {
		for i, pgid32 := range b.pgids {
			pgid := int(pgid32)
			if pgid <= 0 {
				continue // gone, or a kernel thread
			}
			j, ok := slices.BinarySearchFunc(leaders, pgid, func(l leaderAt, pgid int) int { return l.pid - pgid })
			if ok && leaders[j].mark.live && !leaders[j].mark.sup {
				continue
			}
			m := member{pgid: pgid, pid: b.pids[i]}
			if b.starts != nil {
				m.start = b.starts[i]
			}
			open = append(open, m)
		}
	}
	// Stable: members stay in listing order, as the full scan has them.
	slices.SortStableFunc(open, func(a, b member) int { return a.pgid - b.pgid })

	var cands []candidate
	for i := 0; i < len(open); {
		c := candidate{pgid: open[i].pgid}
		for ; i < len(open) && open[i].pgid == c.pgid; i++ {
			c.pids = append(c.pids, open[i].pid)
			c.starts = append(c.starts, open[i].start)
		}
		if j, ok := slices.BinarySearchFunc(leaders, c.pgid, func(l leaderAt, pgid int) int { return l.pid - pgid }); ok {
			c.leader, c.listed = leaders[j].mark, true
		}
		cands = append(cands, c)
	}
	stats.Groups = settled + len(cands)
	return cands
}
