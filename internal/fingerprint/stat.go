// Package fingerprint reads process identity from /proc.
//
// A process identity is its PID plus its start time in clock ticks since
// boot. Two reads with equal PID and start time describe the same process;
// anything else does not. Everything that kc-watchman signals or unlinks is
// decided on identities read here and re-read immediately before acting.
package fingerprint

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"syscall"
)

// ErrNotFound is returned (wrapped) when the process does not exist or
// vanished while it was being read.
var ErrNotFound = errors.New("process not found")

// ErrNotProcess is returned (wrapped) when the PID is the ID of a thread of
// another process: /proc/<tid> answers for it although it is not listed in
// /proc and is not a process of its own.
var ErrNotProcess = errors.New("thread ID, not a process")

// ErrMalformed is returned (wrapped) when a /proc file cannot be parsed.
var ErrMalformed = errors.New("malformed /proc data")

// ErrTooLarge is returned (wrapped) for a /proc file of a process larger
// than MaxFile.
var ErrTooLarge = errors.New("larger than kc-watchman reads of a process's /proc file")

// MaxFile bounds what is read of one /proc file of a process. A process
// makes its argv and environment as large as it likes (execve takes
// several MiB; prctl(PR_SET_MM) points them at any of its memory), and
// root would read all of it; no supervisor's comes near.
const MaxFile = 1 << 20

// Stat holds the fields of /proc/<pid>/stat that identity decisions use.
type Stat struct {
	PID   int
	Comm  string
	State byte
	PPID  int
	PGID  int
	SID   int
	// Threads is num_threads: the live threads of the whole process. A
	// thread-group leader that has exited while other threads run shows
	// state Z with Threads > 1; the process is then still alive.
	Threads    int
	StartTicks uint64
}

// Zombie reports whether the process has exited but not been reaped. The
// state letter alone is not enough: when the main thread of a
// multi-threaded process exits (pthread_exit, or SYS_exit on the main
// thread) the leader shows state Z while the other threads, and so the
// process, keep running. A zero Threads (a Stat built by hand) is read as a
// single thread.
func (s Stat) Zombie() bool {
	dead := s.State == 'Z' || s.State == 'X' || s.State == 'x'
	return dead && s.Threads <= 1
}

// ParseStat parses the contents of /proc/<pid>/stat. The comm field is
// parsed up to the last ')' because comm itself may contain spaces and
// parentheses. It reads the line as the kernel writes it: fields apart by
// ASCII white space, the numbers it uses unsigned decimal; anything else
// is ErrMalformed. It allocates nothing but the comm: the fast scan parses
// one stat per group leader, tens of thousands on a large host.
func ParseStat(data []byte) (Stat, error) {
	var s Stat
	open := bytes.IndexByte(data, '(')
	end := bytes.LastIndexByte(data, ')')
	if open < 1 || end < open {
		return s, fmt.Errorf("%w: no comm in stat", ErrMalformed)
	}
	head := trimASCIISpace(data[:open])
	pid, ok := decimal(head, maxPID)
	if !ok || pid == 0 || len(head) > maxPIDDigits {
		return s, fmt.Errorf("%w: pid %q", ErrMalformed, data[:open])
	}
	s.PID = int(pid)

	// After ") ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8)
	// flags(9) minflt(10) cminflt(11) majflt(12) cmajflt(13) utime(14)
	// stime(15) cutime(16) cstime(17) priority(18) nice(19)
	// num_threads(20) itrealvalue(21) starttime(22).
	var field [20][]byte
	rest, n := data[end+1:], 0
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
	if n < len(field) {
		return s, fmt.Errorf("%w: %d fields after comm", ErrMalformed, n)
	}
	if len(field[0]) != 1 {
		return s, fmt.Errorf("%w: state %q", ErrMalformed, field[0])
	}
	s.State = field[0][0]
	for _, f := range []struct {
		dst *int
		at  int // index after comm; the field's number is at+3
	}{{&s.PPID, 1}, {&s.PGID, 2}, {&s.SID, 3}, {&s.Threads, 17}} {
		v, ok := decimal(field[f.at], math.MaxInt)
		if !ok {
			return s, fmt.Errorf("%w: field %d: %q", ErrMalformed, f.at+3, field[f.at])
		}
		*f.dst = int(v)
	}
	if s.StartTicks, ok = decimal(field[19], math.MaxUint64); !ok {
		return s, fmt.Errorf("%w: starttime %q", ErrMalformed, field[19])
	}
	s.Comm = string(data[open+1 : end])
	return s, nil
}

// maxPID bounds a PID: ten digits at most (leading zeros, which the
// kernel never writes, count), as the kernel's pid_max is far below that.
const (
	maxPID       = 9_999_999_999
	maxPIDDigits = 10
)

// decimal parses ASCII digits only (no sign, no space) as a number no
// greater than limit.
func decimal(b []byte, limit uint64) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (limit-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// isASCIISpace is the white space the kernel may put between fields.
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

// Files reads the files of /proc/<pid>/ that identities are made of:
// stat, status and cmdline. The data need stay valid only until the next
// call; a failure is classified as ReadError does. Dir reads them with
// ReadCapped; the scan's reader (package proctable) with fewer system
// calls. Both parse and check through the functions here, so that they
// cannot disagree.
type Files interface {
	ReadFile(pid int, name string) ([]byte, error)
}

// Dir is a procfs root read with ReadCapped.
type Dir string

// ReadFile reads <d>/<pid>/<name>, at most MaxFile bytes of it; cmdline
// and environ through ReadMemory.
func (d Dir) ReadFile(pid int, name string) ([]byte, error) {
	path := string(d) + "/" + strconv.Itoa(pid) + "/" + name
	var data []byte
	var err error
	if inMemory(name) {
		data, err = ReadMemory(string(d), pid, func() ([]byte, error) { return ReadCapped(path) })
	} else {
		data, err = ReadCapped(path)
	}
	if err != nil {
		return nil, ReadError(pid, err)
	}
	return data, nil
}

// ReadCapped reads the file at path, a process's /proc file, if it holds
// at most MaxFile bytes; ErrTooLarge if more.
func ReadCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFile {
		return nil, fmt.Errorf("%s: %w (%d MiB)", path, ErrTooLarge, MaxFile>>20)
	}
	return data, nil
}

// ReadError classifies an error reading a /proc file of pid: a process
// that is gone (ENOENT on open, or ESRCH on read once the task is gone)
// is ErrNotFound.
func ReadError(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrNotFound)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// ReadStat reads and parses /proc/<pid>/stat under root (normally "/proc").
// It does not check that pid is a process rather than a thread; use Read
// for that.
func ReadStat(root string, pid int) (Stat, error) {
	return ReadStatFrom(Dir(root), pid)
}

// ReadStatFrom is ReadStat through f.
func ReadStatFrom(f Files, pid int) (Stat, error) {
	data, err := f.ReadFile(pid, "stat")
	if err != nil {
		return Stat{}, err
	}
	s, err := ParseStat(data)
	if err != nil {
		return s, fmt.Errorf("pid %d: %w", pid, err)
	}
	if s.PID != pid {
		return s, fmt.Errorf("pid %d: stat reports pid %d: %w", pid, s.PID, ErrMalformed)
	}
	return s, nil
}

// ReadUIDs returns the real, effective and saved UIDs of pid from its
// status (a setuid program keeps its caller's real UID).
func ReadUIDs(root string, pid int) ([3]int, error) {
	_, ids, err := readStatus(Dir(root), pid)
	return ids, err
}

// ParseStatus returns the Tgid and the real, effective and saved UIDs
// from the contents of /proc/<pid>/status.
func ParseStatus(data []byte) (tgid int, ids [3]int, err error) {
	tgid, ids = -1, noUIDs
	haveUIDs := false
	for len(data) > 0 && (tgid < 0 || !haveUIDs) {
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
			ids, err = uidFields(line[len("Uid:"):])
			haveUIDs = true
		}
		if err != nil {
			return -1, noUIDs, err
		}
	}
	if tgid < 0 || !haveUIDs {
		return -1, noUIDs, fmt.Errorf("status lacks Tgid or Uid: %w", ErrMalformed)
	}
	return tgid, ids, nil
}

// noUIDs are the UIDs a status that cannot be read gives: never a zero,
// which would read as root's.
var noUIDs = [3]int{-1, -1, -1}

// uidFields parses the real, effective and saved UIDs, the first three of
// a Uid line's numbers (the fourth is the filesystem UID).
func uidFields(b []byte) ([3]int, error) {
	var ids [3]int
	f := bytes.Fields(b)
	if len(f) < len(ids) {
		return noUIDs, fmt.Errorf("%w: Uid %q", ErrMalformed, bytes.TrimSpace(b))
	}
	for i := range ids {
		v, ok := decimal(f[i], math.MaxInt)
		if !ok {
			return noUIDs, fmt.Errorf("%w: Uid %q", ErrMalformed, bytes.TrimSpace(b))
		}
		ids[i] = int(v)
	}
	return ids, nil
}

// firstInt parses the first of the tab-separated numbers of a status
// line.
func firstInt(b []byte) (int, error) {
	b = trimASCIISpace(b)
	if i := bytes.IndexAny(b, " \t"); i >= 0 {
		b = b[:i]
	}
	v, ok := decimal(b, math.MaxInt)
	if !ok {
		return 0, fmt.Errorf("%w: status field %q", ErrMalformed, b)
	}
	return int(v), nil
}

// readStatus reads pid's Tgid and real, effective and saved UIDs
// through f.
func readStatus(f Files, pid int) (tgid int, ids [3]int, err error) {
	data, err := f.ReadFile(pid, "status")
	if err != nil {
		return -1, noUIDs, err
	}
	if tgid, ids, err = ParseStatus(data); err != nil {
		return -1, noUIDs, fmt.Errorf("pid %d: status: %w", pid, err)
	}
	return tgid, ids, nil
}
