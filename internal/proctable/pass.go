package proctable

import (
	"errors"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Listing /proc is one pass in which every process costs a getpgid(2)
// and every group leader a stat read. Nearly all of its time is system
// calls, so the pass is a pipeline spread over the CPUs: one goroutine
// lists /proc in small batches and hands each batch on while it lists the
// next, and every goroutine, the lister too once it is done, asks for the
// groups of a batch and reads the stat of the leaders in it. Nothing
// waits for the whole list.

// batchBytes sizes each getdents64(2) call of the pass: about 500
// processes, small enough that the other CPUs start early and share the
// work evenly, large enough that the calls do not add up.
const batchBytes = 16 << 10

// minPIDsPerWorker: below this many processes per CPU, one goroutine is
// faster than several.
const minPIDsPerWorker = 1000

// Pipeline overrides batchBytes, minPIDsPerWorker and the number of
// goroutines (GOMAXPROCS) where not zero.
type Pipeline struct {
	BatchBytes, MinPIDsPerWorker, Workers int
}

// batch is one getdents64(2) call's worth of processes and what the pass
// learnt about them.
type batch struct {
	pids    []int
	pgids   []int32
	leaders []Leader
}

// listProc lists opt.Root with the pipelined pass.
func listProc(opt Options) (*Listing, error) {
	bufSize, perWorker, maxWorkers := batchBytes, minPIDsPerWorker, runtime.GOMAXPROCS(0)
	if t := opt.Pipeline; t.BatchBytes > 0 {
		bufSize = t.BatchBytes
	}
	if t := opt.Pipeline; t.MinPIDsPerWorker > 0 {
		perWorker = t.MinPIDsPerWorker
	}
	if t := opt.Pipeline; t.Workers > 0 {
		maxWorkers = t.Workers
	}
	rs := []*passReader{newPassReader(opt)}
	defer func() {
		for _, r := range rs {
			r.Close()
		}
	}()
	d, err := openDir(opt.Root, bufSize)
	if err != nil {
		return nil, err
	}
	defer d.Close()

	host := opt.Root == fingerprint.DefaultRoot
	queue := make(chan *batch, 64)
	var (
		batches []*batch
		wg      sync.WaitGroup
		listed  int
	)
	work := func(r *passReader) {
		for b := range queue {
			r.pass(b, host)
		}
	}
	var listErr error
	for {
		// A dirent for a PID takes at least 24 bytes.
		b := &batch{pids: make([]int, 0, bufSize/24)}
		var done bool
		if b.pids, done, listErr = d.Next(b.pids); listErr != nil || done {
			break
		}
		batches = append(batches, b)
		listed += len(b.pids)
		if len(rs) < maxWorkers && listed >= len(rs)*perWorker {
			r := newPassReader(opt)
			rs = append(rs, r)
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(r)
			}()
		}
		select {
		case queue <- b:
		default:
			// Every other goroutine is busy and the queue is full:
			// doing the batch here costs nothing in waiting.
			rs[0].pass(b, host)
		}
	}
	close(queue)
	work(rs[0])
	wg.Wait()
	if listErr != nil {
		return nil, listErr
	}
	l := &Listing{Lister: "proc", root: opt.Root, named: opt.Named, watch: opt.Watch, PIDs: make([]int, 0, listed), PGIDs: make([]int32, 0, listed)}
	for _, b := range batches {
		l.PIDs = append(l.PIDs, b.pids...)
		l.PGIDs = append(l.PGIDs, b.pgids...)
		l.Leaders = append(l.Leaders, b.leaders...)
	}
	l.ascending = len(l.PIDs)
	for _, r := range rs {
		l.StatReads += r.statReads
		l.Watched = append(l.Watched, r.watched...)
	}
	// Each goroutine kept the leaders of its own batches.
	slices.SortFunc(l.Watched, func(a, b Proc) int { return a.PID - b.PID })
	return l, nil
}

// pass finds the group of every process of b and reads its leaders. On
// the host's /proc it asks getpgid(2), which never blocks (a raw call
// spares the scheduler hand-off, which costs more than the call); another
// procfs root (test fixtures) has its stat files read.
func (r *passReader) pass(b *batch, host bool) {
	b.pgids = make([]int32, len(b.pids))
	for i, pid := range b.pids {
		pgid := -1
		if host {
			if v, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pid), 0, 0); errno == 0 {
				pgid = int(v)
			}
		} else if st, err := r.stat(pid); err == nil {
			pgid = st.PGID
		} else if !errors.Is(err, fingerprint.ErrNotFound) {
			// Its group is unknown; if it leads one, that group must
			// not look leaderless.
			b.leaders = append(b.leaders, Leader{PID: pid, State: Unreadable})
		}
		b.pgids[i] = int32(pgid)
		if pgid == pid {
			b.leaders = append(b.leaders, r.leader(pid))
		}
	}
}
