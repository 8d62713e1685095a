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
	"os"
	"strconv"
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
// parentheses.
func ParseStat(data []byte) (Stat, error) {
	var s Stat
	open := bytes.IndexByte(data, '(')
	end := bytes.LastIndexByte(data, ')')
	if open < 1 || end < open {
		return s, fmt.Errorf("%w: no comm in stat", ErrMalformed)
	}
	pid, err := parsePID(bytes.TrimSpace(data[:open]))
	if err != nil {
		return s, err
	}
	s.PID = pid
	s.Comm = string(data[open+1 : end])

	// After ") ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8)
	// flags(9) minflt(10) cminflt(11) majflt(12) cmajflt(13) utime(14)
	// stime(15) cutime(16) cstime(17) priority(18) nice(19)
	// num_threads(20) itrealvalue(21) starttime(22).
	fields := bytes.Fields(data[end+1:])
	if len(fields) < 20 {
		return s, fmt.Errorf("%w: %d fields after comm", ErrMalformed, len(fields))
	}
	if len(fields[0]) != 1 {
		return s, fmt.Errorf("%w: state %q", ErrMalformed, fields[0])
	}
	s.State = fields[0][0]
	ints := []*int{&s.PPID, &s.PGID, &s.SID}
	for i, dst := range ints {
		v, err := strconv.Atoi(string(fields[1+i]))
		if err != nil {
			return s, fmt.Errorf("%w: field %d: %v", ErrMalformed, 4+i, err)
		}
		*dst = v
	}
	s.Threads, err = strconv.Atoi(string(fields[17]))
	if err != nil {
		return s, fmt.Errorf("%w: num_threads: %v", ErrMalformed, err)
	}
	s.StartTicks, err = strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return s, fmt.Errorf("%w: starttime: %v", ErrMalformed, err)
	}
	return s, nil
}

// parsePID accepts only a positive decimal number: strconv.Atoi would also
// take a sign.
func parsePID(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 10 {
		return 0, fmt.Errorf("%w: pid %q", ErrMalformed, b)
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: pid %q", ErrMalformed, b)
		}
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%w: pid %q", ErrMalformed, b)
	}
	return pid, nil
}

// ReadStat reads and parses /proc/<pid>/stat under root (normally "/proc").
// It does not check that pid is a process rather than a thread; use Read
// for that.
func ReadStat(root string, pid int) (Stat, error) {
	data, err := os.ReadFile(procPath(root, pid, "stat"))
	if err != nil {
		return Stat{}, notFound(pid, err)
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

func procPath(root string, pid int, file string) string {
	return root + "/" + strconv.Itoa(pid) + "/" + file
}

// notFound maps the errors a vanished process produces (ENOENT on open, or
// ESRCH on read once the task is gone) to ErrNotFound.
func notFound(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) || isESRCH(err) {
		return fmt.Errorf("pid %d: %w", pid, ErrNotFound)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}
