// Package proctable lists the host's processes and reads them: the one
// place that knows how to get a complete process table cheaply.
//
// List returns every process with its process group, and what the
// listing learnt of every group leader (alive in its group, a zombie,
// gone; its comm where the caller asked for it). It lists with the BPF
// task iterator (package taskiter) where the kernel and the caller's
// privileges allow, and /proc otherwise. The iterator is not trusted to
// list every process: unless its census proves the pass complete, /proc is
// listed too and what it shows that the iterator did not is added (see
// Listing.Confirm). Reader reads a process's files with few system calls,
// through package fingerprint's parsers.
//
// On a host with tens of thousands of processes, and on a VM where a
// system call costs a microsecond, the system calls are most of what a
// scan costs: the directory is read with getdents64(2) into one buffer,
// a group is asked with a raw getpgid(2), and a file is one openat, read
// and close. Package trees decides what the listing means.
package proctable

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
)

// Lister chooses how List lists the host's processes.
type Lister int

const (
	// ListAuto uses the BPF task iterator where the kernel and the
	// caller's privileges allow it, and /proc otherwise.
	ListAuto Lister = iota
	// ListProc lists /proc: a getpgid(2) per process and a stat read per
	// group leader. It never loads a BPF program.
	ListProc
	// ListBPF requires the BPF task iterator: List fails without it.
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

// ErrNoIterator wraps why a ListBPF listing could not be made.
var ErrNoIterator = errors.New("the BPF task iterator was required")

// Options configure List.
type Options struct {
	// Root is the procfs mount; default /proc. Only the host's /proc can
	// use getpgid(2) and the task iterator; any other root (test
	// fixtures) has every process's stat read for its group.
	Root   string
	Lister Lister
	// Named are the comms the caller decides by: a live leader whose
	// comm is one of them carries it in Leader.Comm. No other comm
	// becomes a string.
	Named map[string]bool
	// Defer leaves completing a listing that the iterator's census
	// could not vouch for to Listing.Confirm, for a caller that may find
	// it has nothing to act on, or that lists /proc (Prefetch) while it
	// reads what it has. Without it, List returns a complete listing.
	Defer bool
	// Pipeline overrides how the /proc listing splits its work (tests
	// force several goroutines and many batches on a small table).
	Pipeline Pipeline
	// Watch picks the processes, leaders or not, that the listing keeps
	// whole in Listing.Watched, by comm (container monitors, whose argv
	// a decision reads). It is asked of every process the task
	// iterator lists, with a comm only valid during the call; the /proc
	// lister knows the comm of group leaders only, and Listing.WatchedAll
	// reads the rest when a decision needs them.
	Watch func(comm []byte) bool
	// Hide drops processes from the task iterator's listing, as the
	// kernel has been seen to (tests).
	Hide func(pid int) bool
	// churn, when set, is told each pass's census before it is judged,
	// and may spoil it, as a fork meanwhile would (tests).
	churn func(*taskiter.Census)
	// Program is an iterator program the caller loaded and keeps (watch:
	// one load for every decision); nil loads one for the listing.
	Program *taskiter.Program
	// LayoutCache, when set and Program is not, is the file in a
	// private directory that the loaded program's layout is kept in
	// (taskiter.LoadCached).
	LayoutCache string
}

// Proc is a process the listing kept whole (Options.Watch).
type Proc struct {
	PID, PPID, PGID int
	// UID is the real UID in the host's terms, -1 where the listing did
	// not learn it (the /proc lister reads stat, which has none).
	UID        int
	StartTicks uint64
	Comm       string
	Zombie     bool
}

// LeaderState is what the listing learnt of a group leader.
type LeaderState uint8

const (
	// Gone: the leader is gone, a zombie, or no longer in its group.
	Gone LeaderState = iota
	// Live: in its own group and not a zombie.
	Live
	// Unreadable: its stat could not be read for another reason than its
	// being gone (out of descriptors, an I/O error, garbled data).
	Unreadable
)

// LeaderOf classifies the stat read of a process listed as leading its
// own group (st and err as fingerprint.ReadStat returns them).
func LeaderOf(pid int, st fingerprint.Stat, err error) LeaderState {
	switch {
	case errors.Is(err, fingerprint.ErrNotFound):
		return Gone
	case err != nil:
		return Unreadable
	case st.PGID != pid || st.Zombie():
		return Gone
	}
	return Live
}

// Leader is a process the listing saw leading its own group.
type Leader struct {
	PID   int
	State LeaderState
	// Comm is set for a Live leader whose comm is in Options.Named.
	Comm string
}

// Listing is the process table at one moment, the one view of the host a
// decision reads (DESIGN "One view of the host"): PIDs[i] is in group PGIDs[i] (-1: gone by
// the time it was asked, 0: a kernel thread), was started at Starts[i]
// clock ticks (0: unknown), is the child of PPIDs[i] and runs as the real
// UID UIDs[i] (-1: unknown). Starts, PPIDs and UIDs are nil for a /proc
// listing, which learns them of no process short of reading its files.
// Every process that exists for the whole of List (and of Confirm, when
// deferred) is in it.
type Listing struct {
	PIDs   []int
	PGIDs  []int32
	Starts []uint64
	PPIDs  []int32
	UIDs   []int32
	// PPIDsPartial: a process Confirm added could not be read, and its
	// parent (-1) is unknown though it lives: the parent links are not
	// to be walked alone (children files instead).
	PPIDsPartial bool
	// Watched are the processes Options.Watch picked, in listing order;
	// for a /proc listing, only group leaders (see WatchedAll).
	Watched []Proc
	// Leaders are the processes listed as leading their group, in
	// listing order (ascending, but for those Confirm adds).
	Leaders []Leader

	// Lister is how the processes were listed: "bpf" or "proc".
	Lister string
	// Method is, for the "bpf" lister, how its program listed
	// (taskiter.Program.Method).
	Method string
	// Fallback says why ListAuto did not use the BPF task iterator;
	// empty when it did or was not asked to.
	Fallback string
	// Refused: the fallback is not for want of the iterator on this host
	// (taskiter.Unsupported) nor for churn (taskiter.ErrChurn), but
	// because a pass here went wrong: a verifier's refusal, a listing
	// at odds with /proc.
	Refused bool
	// Confirmed: the task iterator's listing was checked against /proc's
	// (its census could not vouch for it).
	Confirmed bool
	// Missed counts the processes /proc listed and the task iterator did
	// not (added from /proc; PID 1 alone when the census vouched).
	Missed int
	// Unvouched says why the task iterator's census could not vouch for
	// its pass (and so /proc was, or is to be, listed too); empty when it
	// did, and for a /proc listing.
	Unvouched string
	// Passes counts the BPF passes made: more than one when a pass's
	// census could not vouch for it because the host changed meanwhile,
	// and the walk was run again rather than /proc listed.
	Passes int
	// StatReads counts the stat files read.
	StatReads int

	root    string
	named   map[string]bool
	watch   func([]byte) bool
	pending *confirmation // not nil until an unvouched listing is confirmed
	// iterSeen: the task iterator gave the comm of PIDs[:iterSeen]; the
	// /proc pass and Confirm read it of group leaders only.
	iterSeen int
	// ascending: PIDs[:ascending] is in ascending order; what vouch and
	// Confirm append after it need not be.
	ascending int
	// all is WatchedAll's answer, once completed.
	all []Proc
	// comms holds the task iterator's comm of PIDs[i] at [16*i:16*i+16]
	// (NUL-padded) and dead whether it was a zombie, for the processes
	// the iterator listed (see Seen).
	comms []byte
	dead  []bool
}

// List lists the host's processes (see Options.Lister); the listing is
// complete unless opt.Defer leaves that to Confirm.
func List(opt Options) (*Listing, error) {
	if opt.Root == "" {
		opt.Root = fingerprint.DefaultRoot
	}
	// "/proc/" is the host's /proc too.
	opt.Root = filepath.Clean(opt.Root)
	var fallback string
	var refused bool
	if opt.Lister != ListProc && opt.Root == fingerprint.DefaultRoot {
		l, err := listBPF(opt)
		if err == nil {
			if !opt.Defer {
				if _, err := l.Confirm(); err != nil {
					return nil, err
				}
			}
			return l, nil
		}
		if opt.Lister == ListBPF {
			return nil, fmt.Errorf("%w: %w", ErrNoIterator, err)
		}
		fallback, refused = err.Error(), !taskiter.Unsupported(err) && !errors.Is(err, taskiter.ErrChurn)
	} else if opt.Lister == ListBPF {
		return nil, fmt.Errorf("%w: it lists only the host's /proc, not %s", ErrNoIterator, opt.Root)
	}
	l, err := listProc(opt)
	if err != nil {
		return nil, err
	}
	l.Fallback, l.Refused = fallback, refused
	return l, nil
}

// reserve makes room for n processes in the iterator's columns, which
// a pass fills: grown by appends instead, they would be copied a dozen
// times over at 10,000 processes.
func (l *Listing) reserve(n int) {
	l.PIDs, l.PGIDs = make([]int, 0, n), make([]int32, 0, n)
	l.Starts, l.PPIDs, l.UIDs = make([]uint64, 0, n), make([]int32, 0, n), make([]int32, 0, n)
	l.comms, l.dead = make([]byte, 0, 16*n), make([]bool, 0, n)
	l.Leaders = make([]Leader, 0, n/2)
}

// expectProcesses returns the kernel's task count, which the processes
// cannot outnumber but by those forked meanwhile, capped so that a host
// of many threads does not make a listing reserve for them.
func expectProcesses() int {
	n, err := taskiter.TaskCount()
	if err != nil {
		return 0
	}
	return min(n+n/16, 1<<17)
}

// add appends a process to the listing; ppid and uid are dropped by a
// listing that does not carry them, -1 is unknown.
func (l *Listing) add(pid, pgid int, start uint64, ppid, uid int) {
	l.PIDs = append(l.PIDs, pid)
	l.PGIDs = append(l.PGIDs, int32(pgid))
	if l.Starts != nil {
		l.Starts = append(l.Starts, start)
	}
	if l.PPIDs != nil {
		l.PPIDs = append(l.PPIDs, int32(ppid))
	}
	if l.UIDs != nil {
		l.UIDs = append(l.UIDs, int32(uid))
	}
}

// Seen returns the comm of the process at index i as the task iterator
// saw it, and whether it was a zombie then; ok is false for a process it
// did not list (a /proc listing, or one Confirm added), whose files must
// be read instead.
func (l *Listing) Seen(i int) (comm string, zombie, ok bool) {
	if i < 0 || i >= len(l.dead) {
		return "", false, false
	}
	c := l.comms[16*i : 16*i+16]
	if n := bytes.IndexByte(c, 0); n >= 0 {
		c = c[:n]
	}
	return string(c), l.dead[i], true
}

// Index returns where pid is in the listing, or -1. The listing is in
// ascending PID order but for what Confirm added.
func (l *Listing) Index(pid int) int {
	if i, ok := slices.BinarySearch(l.PIDs[:l.ascending], pid); ok {
		return i
	}
	for i := l.ascending; i < len(l.PIDs); i++ {
		if l.PIDs[i] == pid {
			return i
		}
	}
	return -1
}

// WatchedAll returns every process of the listing that Options.Watch
// picks. From the task iterator that is Watched, which saw every comm;
// a /proc listing saw only its group leaders', and the others' stat is
// read here, once per listing, through r — the /proc fallback's price for
// a decision that needs them, paid only by one that does. It must not be
// called while the listing awaits Confirm.
func (l *Listing) WatchedAll(r *Reader) ([]Proc, error) {
	if l.pending != nil {
		return nil, errors.New("proctable: WatchedAll on a listing that awaits Confirm")
	}
	if l.all != nil || l.watch == nil {
		return l.all, nil
	}
	read := make(map[int]bool, len(l.Leaders))
	for _, ld := range l.Leaders {
		if ld.State != Unreadable {
			read[ld.PID] = true
		}
	}
	all := slices.Clone(l.Watched)
	for i := l.iterSeen; i < len(l.PIDs); i++ {
		pid := l.PIDs[i]
		if l.PGIDs[i] <= 0 || read[pid] {
			continue // gone, a kernel thread, or its comm was read
		}
		st, err := r.Stat(pid)
		switch {
		case errors.Is(err, fingerprint.ErrNotFound), errors.Is(err, fingerprint.ErrNotProcess):
			continue // gone since
		case errors.Is(err, fs.ErrPermission):
			// hidepid=1 shows a non-root caller other users' PIDs and
			// refuses their files: hidden from it, as hidepid=2 hides
			// them wholly (a user's janitor judges his own trees).
			continue
		case err != nil:
			// It may be a watched process (a container's monitor): left
			// out, its absence would read as evidence of none.
			return nil, fmt.Errorf("reading process %d: %w", pid, err)
		case !l.watch([]byte(st.Comm)):
			continue
		}
		all = append(all, procOf(st))
	}
	if all == nil {
		all = []Proc{}
	}
	l.all = all
	return all, nil
}

// procOf is what a stat read tells of a watched process.
func procOf(st fingerprint.Stat) Proc {
	return Proc{PID: st.PID, PPID: st.PPID, PGID: st.PGID, UID: -1, StartTicks: st.StartTicks, Comm: st.Comm, Zombie: st.Zombie()}
}

// passReader reads stat files for a listing, counting them, and keeps
// the leaders Options.Watch picks.
type passReader struct {
	*Reader
	named     map[string]bool
	watch     func([]byte) bool
	watched   []Proc
	statReads int
}

func newPassReader(opt Options) *passReader {
	return &passReader{Reader: NewReader(opt.Root), named: opt.Named, watch: opt.Watch}
}

// stat reads pid's stat, counting it.
func (r *passReader) stat(pid int) (fingerprint.Stat, error) {
	r.statReads++
	return r.Stat(pid)
}

// leader reads a process that leads its own group.
func (r *passReader) leader(pid int) Leader {
	st, err := r.stat(pid)
	return r.leaderFrom(pid, st, err)
}

// leaderFrom is leader from a stat read already made.
func (r *passReader) leaderFrom(pid int, st fingerprint.Stat, err error) Leader {
	l := Leader{PID: pid, State: LeaderOf(pid, st, err)}
	if l.State == Live && r.named[st.Comm] {
		l.Comm = st.Comm
	}
	if err == nil && st.PGID == pid && r.watch != nil && r.watch([]byte(st.Comm)) {
		r.watched = append(r.watched, procOf(st))
	}
	return l
}
