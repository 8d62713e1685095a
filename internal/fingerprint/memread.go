package fingerprint

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrStalled is returned (wrapped) when a read of a process's argv or
// environment did not come back in time, or was not tried because an
// earlier one has not. The process is then as unreadable as one whose
// file could not be opened: its tree is kept and reported.
var ErrStalled = errors.New("read of the process's memory did not return")

// Reading /proc/<pid>/cmdline or environ takes the process's memory map
// lock, and the process decides how long others wait for it: a thread of
// it faulting on a mapping of a file its own FUSE server never sends
// holds the lock, another asking to write it queues, and every reader
// queues behind that, root's included, until the server answers; nothing
// short of SIGKILL of the reader ends the wait. So these reads run where
// the caller can walk away from them.
//
// An abandoned read still holds an OS thread in the kernel, which is the
// whole program's to lose, not one scan's: hence one bound for the
// program (memReads) rather than one per reader. While one is
// outstanding its PID is not read again, and once most are no memory is
// read at all until one returns; a user holding them all makes every run
// report his trees unreadable, never hang.
var memReads = newMemReader(time.Second, 16)

// memReader runs reads of processes' memory with a wait, and remembers
// the ones it walked away from until they return.
type memReader struct {
	wait time.Duration
	most int

	mu    sync.Mutex
	stuck map[int]int // PID → abandoned reads not yet returned
	n     int         // the sum of stuck
}

func newMemReader(wait time.Duration, most int) *memReader {
	return &memReader{wait: wait, most: most, stuck: map[int]int{}}
}

type readResult struct {
	data []byte
	err  error
}

// do is ReadMemory with m's wait and bound.
func (m *memReader) do(pid int, read func() ([]byte, error)) ([]byte, error) {
	m.mu.Lock()
	switch {
	case m.stuck[pid] > 0:
		m.mu.Unlock()
		return nil, fmt.Errorf("pid %d: an earlier read of its memory has not returned: %w", pid, ErrStalled)
	case m.n >= m.most:
		m.mu.Unlock()
		return nil, fmt.Errorf("pid %d: not read while %d reads of processes' memory have not returned: %w", pid, m.n, ErrStalled)
	}
	m.mu.Unlock()

	done := make(chan readResult, 1)
	abandoned := false // under mu
	go func() {
		data, err := read()
		done <- readResult{data, err}
		m.mu.Lock()
		if abandoned {
			m.n--
			if m.stuck[pid]--; m.stuck[pid] == 0 {
				delete(m.stuck, pid)
			}
		}
		m.mu.Unlock()
	}()
	t := time.NewTimer(m.wait)
	defer t.Stop()
	select {
	case r := <-done:
		return r.data, r.err
	case <-t.C:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The read may have returned between the timer and the lock; it
	// then sent before it could look at abandoned.
	select {
	case r := <-done:
		return r.data, r.err
	default:
	}
	abandoned = true
	m.stuck[pid]++
	m.n++
	return nil, fmt.Errorf("pid %d: no answer after %v: %w", pid, m.wait, ErrStalled)
}

// ReadMemory runs read, a read of pid's cmdline or environ, on a
// goroutine of its own and returns what it returns, or ErrStalled if it
// has not returned within a second. read must own everything it touches
// (descriptor, buffer): once abandoned it runs on alone, and ends when
// the process's lock is let go or the process is gone.
func ReadMemory(pid int, read func() ([]byte, error)) ([]byte, error) {
	return memReads.do(pid, read)
}

// inMemory reports whether a /proc/<pid>/ file is read from the process's
// memory.
func inMemory(name string) bool {
	return name == "cmdline" || name == "environ"
}
