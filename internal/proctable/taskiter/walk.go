package taskiter

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The walk: where the kernel has the open-coded task iterator (Linux
// 6.7), the program is attached to one task alone (this process's main
// thread) and, in its one run, walks the kernel's list of processes
// itself, writing one record per process into an array map that this
// process has mapped. The task iterator proper looks every task up by PID
// (an IDR search, the struct pid, a reference taken and dropped): half of
// a pass's time at 10,000 processes. The list walk touches only the task
// it reads.
//
// The records come in the order processes were created, not by PID; the
// pass sorts them. The list is walked under RCU, so a process is seen at
// most once, and every process that lives throughout the pass is seen.
// The read lock is held for the whole walk: about 2.5 ms at 10,000
// processes.

// Map and bpf(2) constants (include/uapi/linux/bpf.h).
const (
	cmdMapCreate     = 0
	mapTypeArray     = 2
	mapFlagMmapable  = 1 << 10
	helperMapLookup  = 1
	pseudoMapFD      = 1
	walkAllProcesses = 0 // BPF_TASK_ITER_ALL_PROCS
)

// walkHeaderSize is the size of what the walk writes to the iterator's
// stream once it has walked the list, three u32s: the index after its
// last record, 1 if the map was too small for them all, and the index of
// its first record.
const walkHeaderSize = 12

type mapCreateAttr struct {
	mapType    uint32
	keySize    uint32
	valueSize  uint32
	maxEntries uint32
	mapFlags   uint32
}

// walkMap is the array map a walk writes its records to, mapped read-only
// into this process.
type walkMap struct {
	fd   int
	cap  int
	data []byte
}

func newWalkMap(capacity int) (*walkMap, error) {
	attr := mapCreateAttr{mapType: mapTypeArray, keySize: 4, valueSize: recordSize, maxEntries: uint32(capacity), mapFlags: mapFlagMmapable}
	fd, err := bpf(cmdMapCreate, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return nil, fmt.Errorf("create the walk's map of %d records: %w", capacity, err)
	}
	size := (capacity*recordSize + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	data, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map the walk's records: %w", err)
	}
	return &walkMap{fd: fd, cap: capacity, data: data}, nil
}

func (m *walkMap) close() {
	if m == nil {
		return
	}
	unix.Munmap(m.data)
	unix.Close(m.fd)
}

func ldMapFD(dst uint8, fd int) [2]insn {
	return [2]insn{{op: opLdImm64, dst: dst, src: pseudoMapFD, imm: int32(fd)}, {}}
}

// walkProgram builds the walk for layout l, writing to map fd.
//
// Stack: the iterator's state at fp-24 (struct bpf_iter_task, 24 bytes),
// the map key at fp-32, the header at fp-48.
func walkProgram(l layout, mapFD int) ([]insn, error) {
	if l.walkNew == 0 || l.rdonlyCast == 0 {
		return nil, fmt.Errorf("kernel without the open-coded task iterator")
	}
	if err := l.validate(); err != nil {
		return nil, err
	}
	var b builder
	const it, key, hdr = -24, -32, -48
	b.add(mov(r6, r1))              // r6 = ctx, until the seq below
	b.add(ldxDW(r7, r6, ctxTask))   // r7 = ctx->task
	b.jump(jeqImm(r7, 0, 0), "out") // the end of the pass
	// r8 = the next record's index. It starts from the meta's seq_num
	// (0: this is the iterator's first and only task), a number the
	// verifier cannot know: from a known 0 it would follow the index
	// through every turn of the loop instead of once.
	b.add(ldxDW(r8, r6, ctxMeta))
	b.add(ldxDW(r8, r8, metaSeqNum))
	b.add(stxW(r10, hdr+8, r8)) // the header's first index
	// r6 = ctx->meta->seq, loaded here, on the one path through the
	// start: a pointer loaded through the meta costs the verifier its
	// by-name BTF searches on every path it checks the load on, and the
	// end is reached on several.
	b.add(ldxDW(r6, r6, ctxMeta))
	b.add(ldxDW(r6, r6, metaSeq))
	b.add(movImm(r9, 0)) // r9 = 1: the map is full
	b.add(mov(r1, r10))
	b.add(addImm(r1, it))
	b.add(movImm(r2, 0))
	b.add(movImm(r3, walkAllProcesses))
	b.add(callKfunc(l.walkNew))
	b.label("next")
	b.add(mov(r1, r10))
	b.add(addImm(r1, it))
	b.add(callKfunc(l.walkNext))
	b.jump(jeqImm(r0, 0, 0), "done")
	b.add(mov(r1, r0))
	b.add(movImm(r2, int32(l.taskStruct)))
	b.add(callKfunc(l.rdonlyCast))
	b.add(mov(r7, r0))
	b.add(ldxW(r2, r7, l.taskPID))
	b.add(ldxW(r3, r7, l.taskTGID))
	b.back(jneReg(r2, r3, 0), "next") // a thread, not a process
	b.add(stxW(r10, key, r8))
	m := ldMapFD(r1, mapFD)
	b.add(m[0])
	b.add(m[1])
	b.add(mov(r2, r10))
	b.add(addImm(r2, key))
	b.add(call(helperMapLookup))
	b.jump(jeqImm(r0, 0, 0), "full")
	b.add(ldxW(r2, r7, l.taskTGID))
	b.add(stxW(r0, 0, r2))
	b.add(ldxW(r2, r7, l.taskExitState))
	b.add(stxW(r0, 8, r2))
	b.add(ldxDW(r2, r7, l.taskStart))
	b.add(stxDW(r0, 16, r2))
	b.add(ldxDW(r2, r7, l.taskComm))
	b.add(stxDW(r0, 24, r2))
	b.add(ldxDW(r2, r7, l.taskComm+8))
	b.add(stxDW(r0, 32, r2))
	b.add(ldxDW(r2, r7, l.taskParent))
	b.add(ldxW(r3, r2, l.taskTGID))
	b.add(stxW(r0, 40, r3))
	b.add(ldxDW(r2, r7, l.taskCred))
	b.add(ldxW(r3, r2, l.credUID))
	b.add(stxW(r0, 44, r3))
	b.add(ldxDW(r2, r7, l.taskSignal))
	b.add(ldxW(r3, r2, l.signalThreads))
	b.add(stxW(r0, 12, r3))
	b.add(ldxDW(r3, r2, l.signalPIDs+8*l.pidtypePGID))
	b.add(ldxW(r3, r3, l.pidNumbers+l.upidNR))
	b.add(stxW(r0, 4, r3))
	b.add(addImm(r8, 1))
	b.back(ja(0), "next")
	b.label("full")
	b.add(movImm(r9, 1))
	b.label("done")
	b.add(mov(r1, r10))
	b.add(addImm(r1, it))
	b.add(callKfunc(l.walkDestroy))
	b.add(stxW(r10, hdr, r8))
	b.add(stxW(r10, hdr+4, r9))
	b.add(mov(r1, r6))
	b.add(mov(r2, r10))
	b.add(addImm(r2, hdr))
	b.add(movImm(r3, walkHeaderSize))
	b.add(call(helperSeq))
	b.label("out")
	b.add(movImm(r0, 0))
	b.add(exit())
	return b.resolve()
}

// runWalk runs the walk once and returns its records sorted by PID (a
// view into the map, valid until the next run), or full if the map was
// too small. twice is a PID listed twice (0: none).
func runWalk(progFd int, m *walkMap) (recs [][]byte, twice int, full bool, err error) {
	// Attached to this process's main thread alone, which lives as long
	// as the process: the program runs once, for it, and once more at
	// the end.
	fd, err := openIter(progFd, unix.Getpid())
	if err != nil {
		return nil, 0, false, err
	}
	defer unix.Close(fd)
	var hdr [walkHeaderSize + 4]byte
	n, got := 0, 0
	for {
		n, err = unix.Read(fd, hdr[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("read the walk: %w", err)
		}
		if n == 0 {
			break
		}
		got += n
	}
	first, end, full, err := parseWalkHeader(hdr[:got], m.cap)
	if err != nil || full {
		return nil, 0, full, err
	}
	recs, twice = walkRecords(m.data, first, end)
	return recs, twice, false, nil
}

// walkRecords returns the records at [first, end) of data by PID, without
// the idle task's: the list starts at PID 0, which is no process (/proc
// and the task iterator do not show it either). twice is a PID listed
// twice, if any: the list is walked in creation order, so a process that
// exits during the walk and whose PID goes to a new process at once is
// seen twice, old and new.
func walkRecords(data []byte, first, end int) (recs [][]byte, twice int) {
	// Each PID is sorted with its record's place packed into one number:
	// a comparison function's calls would cost more than the sort's
	// comparisons.
	keys := make([]uint64, 0, end-first)
	for i := first; i < end; i++ {
		if pid := binary.NativeEndian.Uint32(data[i*recordSize:]); pid != 0 {
			keys = append(keys, uint64(pid)<<32|uint64(i))
		}
	}
	slices.Sort(keys)
	recs = make([][]byte, len(keys))
	for i, k := range keys {
		if i > 0 && k>>32 == keys[i-1]>>32 && twice == 0 {
			twice = int(k >> 32)
		}
		at := int(uint32(k)) * recordSize
		recs[i] = data[at : at+recordSize : at+recordSize]
	}
	return recs, twice
}

// walkChurnTries bounds the walks of a pass during which PIDs keep being
// reused.
const walkChurnTries = 3

// forkedSince returns nil if a process was forked since the kernel's fork
// count (read by count) was forks, and otherwise an error (not churn)
// saying that what happened cannot be the host's doing.
func forkedSince(count func() (uint64, error), forks uint64, what string) error {
	now, err := count()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if now == forks {
		return fmt.Errorf("%w: %s with no process forked meanwhile: the walk misreads this kernel", ErrUnavailable, what)
	}
	return nil
}

// walker is a loaded walk and its map. Its passes take their turn: they
// write to the one map.
type walker struct {
	mu sync.Mutex
	l  layout
	fd int
	m  *walkMap
}

// walkCapacity is the number of records a map is made for, given the
// kernel's task count: room for the processes forked while a pass runs.
// The task count counts threads too; on a host of many threads the first
// map is capped (6 MB), and a pass that fills it makes a map for them all.
func walkCapacity(tasks int) int { return min(tasks+tasks/2+1024, 1<<17) }

func newWalker(l layout) (*walker, error) {
	tasks, err := readLoadavg()
	if err != nil {
		return nil, err
	}
	w := &walker{l: l, fd: -1}
	if err := w.load(walkCapacity(tasks)); err != nil {
		return nil, err
	}
	return w, nil
}

// load makes a map for capacity records and loads the walk that writes
// to it, in place of the ones w has.
func (w *walker) load(capacity int) error {
	m, err := newWalkMap(capacity)
	if err != nil {
		return err
	}
	prog, err := walkProgram(w.l, m.fd)
	if err == nil {
		var fd int
		if fd, err = loadProgram(prog, w.l.iterFunc); err == nil {
			w.release()
			w.fd, w.m = fd, m
			return nil
		}
	}
	m.close()
	return err
}

func (w *walker) release() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
	w.m.close()
	w.m = nil
}

func (w *walker) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release()
}

// each is Program.Each for the walk.
func (w *walker) each(fn func(*Task)) (Census, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var census Census
	if w.fd < 0 {
		return census, fmt.Errorf("%w: the program is not loaded", ErrUnavailable)
	}
	var recs [][]byte
	grown, reused := false, 0
	for {
		var err error
		if census.TasksBefore, census.ForksBefore, err = readCounts(true); err != nil {
			return census, err
		}
		var full bool
		var twice int
		recs, twice, full, err = runWalk(w.fd, w.m)
		if err != nil {
			return census, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		switch {
		case twice != 0:
			// A PID is reused during a walk only by a process forked
			// during it; without one, the walk misreads the kernel.
			if err := forkedSince(readForks, census.ForksBefore, fmt.Sprintf("PID %d was listed twice", twice)); err != nil {
				return census, err
			}
			// The host's PIDs wrapped: a few milliseconds later they
			// likely no longer do.
			if reused++; reused < walkChurnTries {
				continue
			}
			return census, fmt.Errorf("%w: %w: a PID was reused during each of %d walks (last: PID %d)", ErrUnavailable, ErrChurn, reused, twice)
		case full && !grown:
			// More processes than the map holds: once, a map for the
			// host as it is now.
			grown = true
			if err := w.load(max(census.TasksBefore+census.TasksBefore/2+1024, 2*w.m.cap)); err != nil {
				return census, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			continue
		case full:
			// A map with room for half as many again as the kernel's
			// tasks overflows only if the host forked that many.
			if err := forkedSince(readForks, census.ForksBefore, fmt.Sprintf("a map of %d records overflowed", w.m.cap)); err != nil {
				return census, err
			}
			return census, fmt.Errorf("%w: %w: more processes than a map of %d records holds", ErrUnavailable, ErrChurn, w.m.cap)
		}
		break
	}
	ls := newLister(fn)
	for _, rec := range recs {
		ls.record(rec)
	}
	return ls.finish(census)
}

// parseWalkHeader reads what the walk wrote to the stream: the records
// are at [first, end) in a map of capacity records, unless the map was
// full.
func parseWalkHeader(hdr []byte, capacity int) (first, end int, full bool, err error) {
	if len(hdr) != walkHeaderSize {
		return 0, 0, false, fmt.Errorf("the walk wrote %d bytes, want its %d-byte header", len(hdr), walkHeaderSize)
	}
	end, first = int(binary.NativeEndian.Uint32(hdr[0:])), int(binary.NativeEndian.Uint32(hdr[8:]))
	if binary.NativeEndian.Uint32(hdr[4:]) != 0 {
		return 0, 0, true, nil
	}
	if first > end || end > capacity {
		return 0, 0, false, fmt.Errorf("the walk wrote records [%d, %d) into a map of %d", first, end, capacity)
	}
	return first, end, false, nil
}
