// Package trees finds supervisor trees: process groups that hold a process
// carrying a container ID in its argv (an anchor) and at least one process
// whose comm is in the supervisor set (DESIGN §4).
//
// A host has tens of thousands of processes and almost none of them matter,
// so the scan reads files only where a decision needs them: one getpgid(2)
// per process to group them, the leader's stat per group, and full
// identities only for the few candidate groups. It reads those files with
// one openat(2), read(2) and close(2) each into a reused buffer (see
// procReader). Options.Full switches to the simple scan that reads every
// process through package fingerprint; both make the same decisions about
// what may be signalled, which the tests check.
package trees

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// WrapperComm is the comm of `kc-hook supervise`, which always counts as a
// supervisor.
const WrapperComm = "kc-hook"

// ClockTicks is USER_HZ, the unit of start times in /proc/<pid>/stat. It is
// 100 on every Linux architecture kc-watchman runs on.
const ClockTicks = 100

// Key is a process identity within its group, as recorded in the ledger.
type Key struct {
	PID        int
	StartTicks uint64
	PGID       int
}

// Options configure a scan.
type Options struct {
	// Root is the procfs mount; default /proc. Only the host's /proc can
	// use getpgid(2); any other root is read from files.
	Root string
	// Comms is the supervisor set (comm values). WrapperComm is implied.
	Comms []string
	// Known attributes processes to containers by exact identity, for
	// groups whose anchor has died (a crashed kcserver leaves its kernels,
	// which carry no container ID). Built from ledger snapshots.
	Known map[Key]string
	// Full reads every process instead of only what decisions need.
	Full bool
	// Now overrides the clock for age computations (tests).
	Now func() time.Time
}

// Tree is one supervisor tree (or a group that looks like one but must not
// be touched; see Ambiguous and Foreign).
type Tree struct {
	PGID int
	// ContainerID is the container the tree belongs to; empty when
	// Ambiguous.
	ContainerID string
	// ContainerIDs lists every container ID seen in the group: from
	// anchors' argv and from ledger matches.
	ContainerIDs []string
	// Ambiguous: members carry different container IDs. Never signalled.
	Ambiguous bool
	// Foreign: the group's leader is alive and is neither an anchor nor a
	// supervisor (a shell that ran a supervisor by hand). Never
	// signalled. Only the full scan reports these.
	Foreign bool
	// ByLedger: the container was known only from a ledger snapshot.
	ByLedger bool
	// UID is the real UID shared by all members, or -1 when they differ.
	UID int
	// Age is the youngest member's age; AgeKnown is false when it could
	// not be read (the tree may be mid-create).
	Age      time.Duration
	AgeKnown bool
	Members  []fingerprint.Identity
}

// Stats reports how much a scan read, for benchmarks and logs.
type Stats struct {
	Processes int
	Groups    int
	StatReads int
	FullReads int
	Duration  time.Duration
}

// Scan finds the supervisor trees on the host.
func Scan(opt Options) ([]Tree, Stats, error) {
	start := time.Now()
	if opt.Root == "" {
		opt.Root = fingerprint.DefaultRoot
	}
	comms := map[string]bool{WrapperComm: true}
	for _, c := range opt.Comms {
		comms[c] = true
	}
	var stats Stats
	uptime, uptimeErr := readUptime(opt.Root)
	pids, err := listPIDs(opt.Root)
	if err != nil {
		return nil, stats, err
	}
	stats.Processes = len(pids)

	// The fast scan spreads its system calls over the CPUs: they are
	// nearly all of its time, and every group is decided on its own.
	// The full scan stays the simple, sequential reference.
	workers := 1
	if !opt.Full {
		workers = max(1, min(runtime.GOMAXPROCS(0), len(pids)/minPIDsPerWorker))
	}
	ss := make([]*scanner, workers)
	for i := range ss {
		ss[i] = &scanner{opt: opt, comms: comms}
		if !opt.Full {
			ss[i].proc = newProcReader(opt.Root)
			defer ss[i].proc.close()
		}
	}

	groups := group(ss, pids)
	stats.Groups = len(groups)
	pgids := make([]int, 0, len(groups))
	for pgid := range groups {
		pgids = append(pgids, pgid)
	}
	sort.Ints(pgids)

	found := make([]*Tree, len(pgids))
	parallel(workers, func(w int) {
		for i := w; i < len(pgids); i += workers {
			if t, ok := ss[w].examine(pgids[i], groups[pgids[i]]); ok {
				found[i] = &t
			}
		}
	})
	var out []Tree
	for _, t := range found {
		if t == nil {
			continue
		}
		t.AgeKnown = t.AgeKnown && uptimeErr == nil
		if t.AgeKnown {
			t.Age = youngest(t.Members, uptime)
		}
		out = append(out, *t)
	}
	for _, s := range ss {
		stats.StatReads += s.stats.StatReads
		stats.FullReads += s.stats.FullReads
	}
	stats.Duration = time.Since(start)
	return out, stats, nil
}

// minPIDsPerWorker: below this many processes per CPU, one goroutine is
// faster than several.
const minPIDsPerWorker = 1000

// parallel runs f(0) … f(n-1) concurrently and waits for them.
func parallel(n int, f func(w int)) {
	var wg sync.WaitGroup
	for w := 1; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(w)
		}()
	}
	f(0)
	wg.Wait()
}

// scanner reads and decides for one goroutine of a scan.
type scanner struct {
	opt   Options
	comms map[string]bool
	stats Stats
	// proc is the fast scan's reader; nil for the full scan, which reads
	// through package fingerprint.
	proc *procReader
}

// readStat reads pid's stat: through the fast reader, or (full scan)
// fingerprint.ReadStat.
func (s *scanner) readStat(pid int) (fingerprint.Stat, error) {
	s.stats.StatReads++
	if s.proc != nil {
		return s.proc.stat(pid)
	}
	return fingerprint.ReadStat(s.opt.Root, pid)
}

// readIdentity reads pid's full identity: through the fast reader, or
// (full scan) fingerprint.Read.
func (s *scanner) readIdentity(pid int) (fingerprint.Identity, error) {
	s.stats.FullReads++
	if s.proc != nil {
		return s.proc.identity(pid)
	}
	return fingerprint.Read(s.opt.Root, pid)
}

// group maps each PGID to its members, in the order of pids. Processes
// that vanish are dropped. On the host's /proc the fast scan asks
// getpgid(2), spread over the scanners; otherwise (the full scan, or
// another procfs root) it reads each process's stat.
func group(ss []*scanner, pids []int) map[int][]int {
	opt := ss[0].opt
	pgidOf := make([]int, len(pids))
	if opt.Root == fingerprint.DefaultRoot && !opt.Full {
		chunk := (len(pids) + len(ss) - 1) / len(ss)
		parallel(len(ss), func(w int) {
			for i := w * chunk; i < min(len(pids), (w+1)*chunk); i++ {
				// getpgid(2) never blocks: a raw call spares the
				// scheduler hand-off, which costs more than the call.
				r, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pids[i]), 0, 0)
				if errno != 0 {
					pgidOf[i] = -1
					continue
				}
				pgidOf[i] = int(r)
			}
		})
	} else {
		for i, pid := range pids {
			st, err := ss[0].readStat(pid)
			if err != nil {
				pgidOf[i] = -1
				continue
			}
			pgidOf[i] = st.PGID
		}
	}
	groups := make(map[int][]int, len(pids)/2)
	for i, pgid := range pgidOf {
		if pgid <= 0 {
			continue // gone, or a kernel thread
		}
		groups[pgid] = append(groups[pgid], pids[i])
	}
	return groups
}

// examine decides whether a group is a candidate and, if so, reads it.
func (s *scanner) examine(pgid int, pids []int) (Tree, bool) {
	leaderListed := slices.Contains(pids, pgid)
	leaderLive := false
	var leader fingerprint.Stat
	if leaderListed {
		st, err := s.readStat(pgid)
		if err == nil && st.PGID == pgid && !st.Zombie() {
			leader, leaderLive = st, true
		}
	}

	// A group led by a live non-supervisor is never ours to signal. The
	// fast scan stops here; the full scan reads it to report it.
	leaderSup := leaderLive && s.supervisor(leader.PID, leader.Comm, nil)
	if leaderLive && !leaderSup && !s.opt.Full {
		return Tree{}, false
	}
	if !leaderSup {
		if !s.interesting(pgid, pids) {
			return Tree{}, false
		}
	}

	t := Tree{PGID: pgid, UID: -2, AgeKnown: true}
	for _, pid := range pids {
		id, err := s.readIdentity(pid)
		if err != nil {
			if !errors.Is(err, fingerprint.ErrNotFound) {
				t.AgeKnown = false
			}
			continue
		}
		if id.PGID != pgid || id.Zombie() {
			continue
		}
		t.Members = append(t.Members, id)
		switch {
		case t.UID == -2:
			t.UID = id.UID
		case t.UID != id.UID:
			t.UID = -1
		}
		for _, cid := range containerid.FromArgv(id.Argv) {
			t.addID(cid)
		}
		if cid, ok := s.opt.Known[Key{PID: id.PID, StartTicks: id.StartTicks, PGID: pgid}]; ok {
			if !slices.Contains(t.ContainerIDs, cid) {
				t.ByLedger = true
			}
			t.addID(cid)
		}
	}
	if len(t.Members) == 0 || !s.hasSupervisorOrKnown(t) {
		return Tree{}, false
	}
	if t.UID == -2 {
		t.UID = -1
	}
	// DESIGN §4 calls a group foreign when its live leader is neither an
	// anchor nor a supervisor. kc-watchman is stricter: any live leader
	// outside the supervisor set makes the group foreign, anchor or not.
	// A wrapper that leads its supervisor's group must be named in the
	// supervisor set to be reaped; this keeps the fast scan, which never
	// reads such groups, in agreement with the full one.
	t.Foreign = leaderLive && !leaderSup
	switch len(t.ContainerIDs) {
	case 0:
		// A supervisor with no container ID (e.g. a desktop Positron's own
		// kcserver) is not a supervisor tree: nothing ties it to a
		// container, so it is never ours.
		return Tree{}, false
	case 1:
		t.ContainerID = t.ContainerIDs[0]
		if t.ByLedger {
			t.ByLedger = !anyAnchor(t.Members)
		}
	default:
		t.Ambiguous = true
	}
	return t, true
}

// interesting is the cheap pre-check for groups without a live supervisor
// leader: does any member have a supervisor comm or a ledger identity?
func (s *scanner) interesting(pgid int, pids []int) bool {
	for _, pid := range pids {
		st, err := s.readStat(pid)
		if err != nil || st.PGID != pgid || st.Zombie() {
			continue
		}
		if s.supervisor(pid, st.Comm, nil) {
			return true
		}
		if _, ok := s.opt.Known[Key{PID: pid, StartTicks: st.StartTicks, PGID: pgid}]; ok {
			return true
		}
	}
	return false
}

func (s *scanner) hasSupervisorOrKnown(t Tree) bool {
	for _, m := range t.Members {
		if s.supervisor(m.PID, m.Comm, m.Argv) {
			return true
		}
		if _, ok := s.opt.Known[Key{PID: m.PID, StartTicks: m.StartTicks, PGID: t.PGID}]; ok {
			return true
		}
	}
	return false
}

// supervisor reports whether a process is in the supervisor set. A
// process named kc-hook counts only as the `kc-hook supervise` wrapper:
// kc-hook's own stages run under that name too, and at poststop one can sit
// in a group whose other members carry the container ID (conmon's, with
// podman's cleanup in it). argv is read when not given, and only then.
func (s *scanner) supervisor(pid int, comm string, argv []string) bool {
	if !s.comms[comm] {
		return false
	}
	if comm != WrapperComm || slices.Contains(s.opt.Comms, WrapperComm) {
		return true
	}
	if argv == nil {
		var err error
		if argv, err = fingerprint.ReadArgv(s.opt.Root, pid); err != nil {
			return false
		}
	}
	return IsWrapperArgv(argv)
}

// IsWrapperArgv reports whether argv is a `kc-hook … supervise …`
// command line: "supervise" among the arguments before any "--".
func IsWrapperArgv(argv []string) bool {
	for _, a := range argv[min(1, len(argv)):] {
		if a == "--" {
			return false
		}
		if a == "supervise" {
			return true
		}
	}
	return false
}

func (t *Tree) addID(cid string) {
	if !slices.Contains(t.ContainerIDs, cid) {
		t.ContainerIDs = append(t.ContainerIDs, cid)
	}
}

func anyAnchor(ms []fingerprint.Identity) bool {
	for _, m := range ms {
		if len(containerid.FromArgv(m.Argv)) > 0 {
			return true
		}
	}
	return false
}

// Signalable reports whether the tree may ever be signalled on the grounds
// of its structure alone (liveness, age and ownership are the caller's).
func (t Tree) Signalable() bool {
	return !t.Ambiguous && !t.Foreign && t.ContainerID != "" && len(t.Members) > 0
}

func youngest(ms []fingerprint.Identity, uptime time.Duration) time.Duration {
	var newest uint64
	for _, m := range ms {
		if m.StartTicks > newest {
			newest = m.StartTicks
		}
	}
	age := uptime - ticksToDuration(newest)
	if age < 0 {
		return 0
	}
	return age
}

func ticksToDuration(t uint64) time.Duration {
	return time.Duration(t) * (time.Second / ClockTicks)
}

// listPIDs reads the numeric entries of root. Threads are not listed there,
// only thread-group leaders. It reads the directory with getdents64(2)
// into a 64 KiB buffer and parses the names in place: a /proc with tens of
// thousands of entries then takes a handful of calls and no allocation
// per entry.
func listPIDs(root string) ([]int, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reading process list: %w", &os.PathError{Op: "open", Path: root, Err: err})
	}
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	pids := make([]int, 0, 1024)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading process list: %w", &os.PathError{Op: "getdents", Path: root, Err: err})
		}
		if n <= 0 {
			return pids, nil
		}
		// struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2),
		// d_type (1), d_name (NUL-terminated).
		for off := 0; off+19 < n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen <= 0 || off+reclen > n {
				break
			}
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if pid, ok := parsePID(name); ok {
				pids = append(pids, pid)
			}
			off += reclen
		}
	}
}

// parsePID accepts what strconv.Atoi accepts of a name that starts with a
// digit: decimal digits only, within int range.
func parsePID(name []byte) (int, bool) {
	if len(name) == 0 || len(name) > 18 {
		return 0, false
	}
	v := 0
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// readUptime returns the time since boot from root/uptime.
func readUptime(root string) (time.Duration, error) {
	data, err := os.ReadFile(root + "/uptime")
	if err != nil {
		return 0, fmt.Errorf("reading uptime: %w", err)
	}
	var secs float64
	if _, err := fmt.Sscanf(string(data), "%f", &secs); err != nil {
		return 0, fmt.Errorf("parsing uptime %q: %w", data, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// KnownFrom builds Options.Known from ledger records of the current boot.
// Records from another boot name processes that no longer exist and are
// never used.
func KnownFrom(recs []*ledger.Record, bootID string) map[Key]string {
	m := map[Key]string{}
	for _, r := range recs {
		if r.BootID != bootID {
			continue
		}
		for _, t := range r.Trees {
			// A snapshot of a group that was not the container's to reap
			// (ambiguous, foreign, another UID) must not make it so later,
			// once its anchors are gone.
			if strings.HasPrefix(t.Action, "skipped-") {
				continue
			}
			for _, p := range t.Members {
				m[Key{PID: p.PID, StartTicks: p.StartTicks, PGID: t.PGID}] = r.ContainerID
			}
		}
	}
	return m
}

// Snapshot converts a tree to its ledger form.
func (t Tree) Snapshot(source string, now time.Time) ledger.Tree {
	lt := ledger.Tree{PGID: t.PGID, UID: t.UID, Source: source, SeenAt: now.UTC()}
	for _, m := range t.Members {
		lt.Members = append(lt.Members, ledger.Process{PID: m.PID, StartTicks: m.StartTicks, Comm: m.Comm})
	}
	return lt
}

// Stats returns the members' identities in the form pgkill revalidates.
func (t Tree) Stats() []fingerprint.Stat {
	out := make([]fingerprint.Stat, len(t.Members))
	for i, m := range t.Members {
		out[i] = m.Stat
	}
	return out
}

// procReader reads /proc files for the fast scan with one openat(2) (relative
// to a descriptor of the procfs root), one read(2) and one close(2) each,
// into a buffer it reuses. os.ReadFile, which package fingerprint uses,
// makes about three times as many system calls per file (fstat twice,
// fcntl, an epoll registration that procfs refuses, a read to see EOF),
// and allocates a buffer each time; on a host with tens of thousands of
// processes those calls are most of a scan's time.
//
// It returns exactly what fingerprint.ReadStat and fingerprint.Read return
// (the same parsers, the same checks, the same error classes: ErrNotFound
// for a process that is gone, ErrNotProcess for a thread ID, ErrMalformed
// for unparsable data), so the scan's decisions do not depend on which
// reader it used; TestFastScanMatchesFullScan and TestProcReaderMatchesFingerprint
// check that.
type procReader struct {
	root  string
	dirfd int // -1 when root could not be opened: paths are used instead
	buf   []byte
	name  []byte
}

func newProcReader(root string) *procReader {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	return &procReader{root: root, dirfd: fd, buf: make([]byte, 4096), name: make([]byte, 0, 64)}
}

func (r *procReader) close() {
	if r.dirfd >= 0 {
		unix.Close(r.dirfd)
		r.dirfd = -1
	}
}

// read returns the contents of <root>/<pid>/<file>, valid until the next
// call. stat and status are seq_file single records, which procfs hands
// over whole in the first read(2) when the buffer is large enough: a
// short first read is the whole file. cmdline is read to EOF.
//
// stat is read with raw system calls (no scheduler hand-off): reading
// it never waits on the target process (unlike cmdline, which takes its
// mmap lock), and the hand-offs the Go runtime makes around thousands of
// short system calls cost more than the calls themselves.
func (r *procReader) read(pid int, file string) ([]byte, error) {
	single, raw := file != "cmdline", file == "stat"
	r.name = strconv.AppendInt(r.name[:0], int64(pid), 10)
	r.name = append(r.name, '/')
	r.name = append(r.name, file...)
	if r.dirfd < 0 {
		r.name = append([]byte(r.root+"/"), r.name...)
	}
	r.name = append(r.name, 0)
	fd, err := r.openat(r.name, raw)
	if err != nil {
		return nil, procErr(pid, err)
	}
	defer r.closefd(fd, raw)
	n := 0
	for {
		if n == len(r.buf) {
			r.buf = append(r.buf, make([]byte, len(r.buf))...)
		}
		m, err := r.readfd(fd, r.buf[n:], raw)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, procErr(pid, err)
		}
		if m == 0 {
			break
		}
		n += m
		if single && n < len(r.buf) {
			break
		}
	}
	return r.buf[:n], nil
}

// openat opens the NUL-terminated path relative to the root descriptor
// (an absolute path when there is none).
func (r *procReader) openat(path []byte, raw bool) (int, error) {
	dirfd := r.dirfd
	if dirfd < 0 {
		dirfd = unix.AT_FDCWD
	}
	for {
		var fd uintptr
		var errno unix.Errno
		if raw {
			fd, _, errno = unix.RawSyscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
		} else {
			fd, _, errno = unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
		}
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
}

func (r *procReader) readfd(fd int, p []byte, raw bool) (int, error) {
	var n uintptr
	var errno unix.Errno
	if raw {
		n, _, errno = unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	} else {
		n, _, errno = unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func (r *procReader) closefd(fd int, raw bool) {
	if raw {
		unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
		return
	}
	unix.Close(fd)
}

// procErr classifies a read error as package fingerprint does: a process
// that is gone (ENOENT on open, ESRCH on read) is ErrNotFound.
func procErr(pid int, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, fingerprint.ErrNotFound)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// stat is fingerprint.ReadStat.
func (r *procReader) stat(pid int) (fingerprint.Stat, error) {
	data, err := r.read(pid, "stat")
	if err != nil {
		return fingerprint.Stat{}, err
	}
	st, err := parseStat(data)
	if err != nil {
		return st, fmt.Errorf("pid %d: %w", pid, err)
	}
	if st.PID != pid {
		return st, fmt.Errorf("pid %d: stat reports pid %d: %w", pid, st.PID, fingerprint.ErrMalformed)
	}
	return st, nil
}

// identity is fingerprint.Read: stat, then Tgid and Uid from status (a
// thread ID is not a process), argv, and stat again (a PID recycled
// between the reads shows another start time).
func (r *procReader) identity(pid int) (fingerprint.Identity, error) {
	var id fingerprint.Identity
	st, err := r.stat(pid)
	if err != nil {
		return id, err
	}
	id.Stat = st
	data, err := r.read(pid, "status")
	if err != nil {
		return id, err
	}
	if id.TGID, id.UID, err = parseStatusIDs(data); err != nil {
		return id, fmt.Errorf("pid %d: status: %w", pid, err)
	}
	if id.TGID != pid {
		return id, fmt.Errorf("pid %d (thread of %d): %w", pid, id.TGID, fingerprint.ErrNotProcess)
	}
	data, err = r.read(pid, "cmdline")
	if err != nil {
		return id, err
	}
	id.Argv = fingerprint.SplitArgv(data)
	again, err := r.stat(pid)
	if err != nil {
		return id, err
	}
	if again.StartTicks != st.StartTicks {
		return id, fmt.Errorf("pid %d was recycled while being read: %w", pid, fingerprint.ErrNotFound)
	}
	return id, nil
}

// parseStatusIDs returns the Tgid and the real UID (the first field of
// Uid) from /proc/<pid>/status.
func parseStatusIDs(data []byte) (tgid, uid int, err error) {
	tgid, uid = -1, -1
	for len(data) > 0 && (tgid < 0 || uid < 0) {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		switch {
		case bytes.HasPrefix(line, []byte("Tgid:")):
			tgid, err = firstInt(line[len("Tgid:"):])
		case bytes.HasPrefix(line, []byte("Uid:")):
			uid, err = firstInt(line[len("Uid:"):])
		}
		if err != nil {
			return -1, -1, err
		}
	}
	if tgid < 0 || uid < 0 {
		return -1, -1, fmt.Errorf("status lacks Tgid or Uid: %w", fingerprint.ErrMalformed)
	}
	return tgid, uid, nil
}

func firstInt(b []byte) (int, error) {
	f := bytes.Fields(b)
	if len(f) == 0 {
		return 0, fmt.Errorf("%w: empty field", fingerprint.ErrMalformed)
	}
	v, err := strconv.Atoi(string(f[0]))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", fingerprint.ErrMalformed, err)
	}
	return v, nil
}

// parseStat is fingerprint.ParseStat without its allocations (bytes.Fields
// builds a slice of some fifty fields for each call, which on a large host
// is most of what a scan allocates). It handles the well-formed case a
// kernel writes: ASCII, unsigned decimal numbers. Anything else (other
// whitespace, signs, overflow, too few fields, non-ASCII bytes) goes to
// fingerprint.ParseStat, so the result, error included, is always the
// one ParseStat gives; FuzzParseStat checks that.
func parseStat(data []byte) (fingerprint.Stat, error) {
	if st, ok := parseStatASCII(data); ok {
		return st, nil
	}
	return fingerprint.ParseStat(data)
}

func parseStatASCII(data []byte) (fingerprint.Stat, bool) {
	var st fingerprint.Stat
	open := bytes.IndexByte(data, '(')
	end := bytes.LastIndexByte(data, ')')
	if open < 1 || end < open {
		return st, false
	}
	head := trimASCIISpace(data[:open])
	if len(head) == 0 || len(head) > 10 {
		return st, false
	}
	pid, ok := decimal(head, 10)
	if !ok || pid == 0 {
		return st, false
	}
	st.PID = int(pid)
	// Fields after the comm: 0 state, 1 ppid, 2 pgrp, 3 session, …,
	// 17 num_threads, 18 itrealvalue, 19 starttime.
	rest := data[end+1:]
	for _, c := range rest {
		if c >= 0x80 {
			return st, false // bytes.Fields would apply Unicode spacing rules
		}
	}
	var field [20][]byte
	n := 0
	for i := 0; i < len(rest) && n < len(field); {
		for i < len(rest) && isASCIISpace(rest[i]) {
			i++
		}
		j := i
		for j < len(rest) && !isASCIISpace(rest[j]) {
			j++
		}
		if j > i {
			field[n] = rest[i:j]
			n++
		}
		i = j
	}
	if n < len(field) || len(field[0]) != 1 {
		return st, false
	}
	st.State = field[0][0]
	for i, dst := range []*int{&st.PPID, &st.PGID, &st.SID, &st.Threads} {
		f := field[1+i]
		if i == 3 {
			f = field[17]
		}
		v, ok := decimal(f, 18)
		if !ok {
			return st, false
		}
		*dst = int(v)
	}
	v, ok := decimal(field[19], 19)
	if !ok {
		return st, false
	}
	st.StartTicks = v
	st.Comm = string(data[open+1 : end])
	return st, true
}

// decimal parses 1 to maxLen ASCII digits.
func decimal(b []byte, maxLen int) (uint64, bool) {
	if len(b) == 0 || len(b) > maxLen {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// isASCIISpace is the ASCII white space of bytes.Fields.
func isASCIISpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func trimASCIISpace(b []byte) []byte {
	for len(b) > 0 && isASCIISpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isASCIISpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}
