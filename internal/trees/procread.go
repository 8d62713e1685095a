package trees

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

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

// identitySince reads pid's identity for a process seen (listed, or read)
// started at start: status (Tgid and Uid: a thread ID is not a process),
// cmdline, then stat. A stat that still shows that start time proves
// status and cmdline were that process's (a PID and a start time are
// never reused together within a boot); any other start time reads as the
// process gone.
func (r *procReader) identitySince(pid int, start uint64) (fingerprint.Identity, error) {
	var id fingerprint.Identity
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
	if id.Stat, err = r.stat(pid); err != nil {
		return id, err
	}
	if id.StartTicks != start {
		return id, fmt.Errorf("pid %d is not the process seen at %d ticks any more: %w", pid, start, fingerprint.ErrNotFound)
	}
	return id, nil
}

// identity is fingerprint.Read: stat, then identitySince with the start
// time it shows (a PID recycled between the reads shows another one).
func (r *procReader) identity(pid int) (fingerprint.Identity, error) {
	st, err := r.stat(pid)
	if err != nil {
		return fingerprint.Identity{}, err
	}
	return r.identitySince(pid, st.StartTicks)
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
