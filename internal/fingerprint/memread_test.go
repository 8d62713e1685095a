package fingerprint

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestMemReaderWalksAwayAndRemembers drives memReader with reads that
// block until released: a read past the wait is given up on, its PID is
// not read again until it returns, no read at all is tried while most
// are outstanding, and both come back once the reads return.
func TestMemReaderWalksAwayAndRemembers(t *testing.T) {
	m := newMemReader(50*time.Millisecond, 2)
	var mu sync.Mutex
	called := map[int]int{}
	calls := func(pid int) int {
		mu.Lock()
		defer mu.Unlock()
		return called[pid]
	}
	release := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	read := func(pid int) ([]byte, error) {
		hold := release[pid]
		return m.do(pid, func() ([]byte, error) {
			mu.Lock()
			called[pid]++
			mu.Unlock()
			if hold != nil {
				<-hold
				return nil, errors.New("released")
			}
			return []byte("argv"), nil
		})
	}

	steps := []struct {
		name  string
		pid   int
		stall bool // ErrStalled expected
		calls int  // read's calls for pid after the step
	}{
		{"a read that returns", 3, false, 1},
		{"a read past the wait", 1, true, 1},
		{"the same PID again", 1, true, 1},
		{"another PID", 3, false, 2},
		{"a second read past the wait", 2, true, 1},
		{"any PID once most are out", 4, true, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			data, err := read(s.pid)
			if got := errors.Is(err, ErrStalled); got != s.stall {
				t.Fatalf("read(%d) = %q, %v; stalled %v, want %v", s.pid, data, err, got, s.stall)
			}
			if !s.stall && string(data) != "argv" {
				t.Fatalf("read(%d) = %q", s.pid, data)
			}
			// A read given up on may not have started yet.
			deadline := time.Now().Add(10 * time.Second)
			for calls(s.pid) < s.calls && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := calls(s.pid); n != s.calls {
				t.Fatalf("pid %d read %d times, want %d", s.pid, n, s.calls)
			}
		})
	}
	close(release[1])
	close(release[2])
	release[1], release[2] = nil, nil
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		n, stuck := m.n, len(m.stuck)
		m.mu.Unlock()
		if n == 0 && stuck == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads (%d PIDs) still counted after they returned", n, stuck)
		}
		time.Sleep(time.Millisecond)
	}
	for _, pid := range []int{1, 4} {
		if data, err := read(pid); err != nil || string(data) != "argv" {
			t.Errorf("pid %d after the release: %q, %v", pid, data, err)
		}
	}
}
