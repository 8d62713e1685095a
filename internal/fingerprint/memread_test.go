package fingerprint

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMemReaderWalksAwayAndRemembers drives memReader with reads that
// block until released: a read past the wait is given up on, its PID is
// not read again until it returns, nor any of its owner's once he has
// perOwner out, nor any at all while most are out; all come back once
// the reads return.
func TestMemReaderWalksAwayAndRemembers(t *testing.T) {
	// Long enough that a read that returns at once is never taken for
	// stalled on a loaded machine.
	m := newMemReader(300*time.Millisecond, 300*time.Millisecond, 3, 1)
	owner := map[int]int{1: 10, 2: 10, 3: 20, 4: 50, 5: 30, 6: 40}
	var mu sync.Mutex
	called := map[int]int{}
	calls := func(pid int) int {
		mu.Lock()
		defer mu.Unlock()
		return called[pid]
	}
	release := map[int]chan struct{}{1: make(chan struct{}), 5: make(chan struct{}), 6: make(chan struct{})}
	read := func(pid int) ([]byte, error) {
		hold := release[pid]
		return m.do(pid, func() int { return owner[pid] }, func() ([]byte, error) {
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
		{"another PID of the same owner", 2, true, 0},
		{"another owner's", 3, false, 2},
		{"a second owner's read past the wait", 5, true, 1},
		{"a third owner's read past the wait", 6, true, 1},
		{"anyone's once most are out", 4, true, 0},
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
	for _, pid := range []int{1, 5, 6} {
		close(release[pid])
		release[pid] = nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		n, stuck, owners := m.n, len(m.stuck), len(m.owners)
		m.mu.Unlock()
		if n == 0 && stuck == 0 && owners == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads (%d PIDs) still counted after they returned", n, stuck)
		}
		time.Sleep(time.Millisecond)
	}
	for _, pid := range []int{1, 2, 4} {
		if data, err := read(pid); err != nil || string(data) != "argv" {
			t.Errorf("pid %d after the release: %q, %v", pid, data, err)
		}
	}
}

// TestOwnerOf: processes of a rootless user's containers run as his
// subordinate UIDs, in namespaces he made (here root stands for him), and
// are all counted against the one who made the outermost namespace; a
// namespace made inside one is walked up from. Processes in ours count
// against their real UID.
func TestOwnerOf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it maps UIDs")
	}
	userns := func(host int) *syscall.SysProcAttr {
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: host, Size: 1}}
		// The credential is taken inside the namespace: the process is
		// then host UID host, as a container's is.
		return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m,
			Credential: &syscall.Credential{Uid: 0, Gid: 0}}
	}
	for _, tc := range []struct {
		name           string
		argv           []string
		attr           *syscall.SysProcAttr
		realUID, owner int
	}{
		{"ours", []string{"sleep", "1000"}, nil, 0, 0},
		{"another user's", []string{"sleep", "1000"}, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}, 65534, 65534},
		{"a subordinate UID", []string{"sleep", "1000"}, userns(100000), 100000, 0},
		{"another subordinate UID", []string{"sleep", "1000"}, userns(100001), 100001, 0},
		{"a namespace made inside one", []string{"unshare", "-U", "sleep", "1000"}, userns(100002), 100002, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.SysProcAttr = tc.attr
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Skipf("cannot start it here: %v", err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			pid := cmd.Process.Pid
			// unshare has made its namespace once it runs sleep.
			deadline := time.Now().Add(10 * time.Second)
			for {
				comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
				if string(comm) == "sleep\n" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pid %d never ran sleep (comm %q)", pid, comm)
				}
				time.Sleep(time.Millisecond)
			}
			if _, ids, err := readStatus(Dir("/proc"), pid); err != nil || ids[0] != tc.realUID {
				t.Fatalf("real UID %d, %v; want %d", ids[0], err, tc.realUID)
			}
			if got := ownerOf("/proc", pid); got != tc.owner {
				t.Errorf("ownerOf = %d, want %d", got, tc.owner)
			}
		})
	}
}

// TestMemReaderWaitsLessForASuspect: once a read of an owner's process
// is out, reads of his other processes are waited for only the suspect's
// wait; another owner's still get the full one.
func TestMemReaderWaitsLessForASuspect(t *testing.T) {
	const wait, suspect = time.Second, 10 * time.Millisecond
	m := newMemReader(wait, suspect, 8, 4)
	owner := map[int]int{1: 10, 2: 10, 3: 20}
	hold := make(chan struct{})
	defer close(hold)
	stall := func(pid int) time.Duration {
		start := time.Now()
		_, err := m.do(pid, func() int { return owner[pid] }, func() ([]byte, error) {
			<-hold
			return nil, nil
		})
		if !errors.Is(err, ErrStalled) {
			t.Fatalf("read(%d): %v, want ErrStalled", pid, err)
		}
		return time.Since(start)
	}
	if d := stall(1); d < wait {
		t.Errorf("the first read was given up after %v, before the wait (%v)", d, wait)
	}
	if d := stall(2); d >= wait/2 {
		t.Errorf("a suspect's next read was waited for %v; want about %v", d, suspect)
	}
	if d := stall(3); d < wait {
		t.Errorf("another owner's read was given up after %v, before the wait (%v)", d, wait)
	}
}
