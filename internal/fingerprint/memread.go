package fingerprint

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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
// outstanding its PID is not read again; while an owner (ownerOf: a
// rootless user for all his containers' processes) has four out, no
// process of his is read; once 64 are out, none at all until one
// returns. So one user stalling reads makes his own trees unreadable,
// not others', and every run reports them, never hangs.
//
// An owner with a read out is a suspect: his other processes' reads are
// waited for a tenth of a second, not a second (a read that is not held
// returns in microseconds), so that he costs a one-shot run such as
// kc-hook's about 1.3 s, not 4.
var memReads = newMemReader(time.Second, 100*time.Millisecond, 64, 4)

// memReader runs reads of processes' memory with a wait, and remembers
// the ones it walked away from until they return.
type memReader struct {
	wait     time.Duration
	suspect  time.Duration // the wait for an owner with reads out
	most     int
	perOwner int

	mu     sync.Mutex
	stuck  map[int]int // PID → abandoned reads not yet returned
	owners map[int]int // owner → the same
	n      int         // the sum of stuck
}

func newMemReader(wait, suspect time.Duration, most, perOwner int) *memReader {
	return &memReader{wait: wait, suspect: suspect, most: most, perOwner: perOwner, stuck: map[int]int{}, owners: map[int]int{}}
}

type readResult struct {
	data []byte
	err  error
}

// do is ReadMemory with m's bounds; owner returns the process's owner
// (-1: unknown). It is asked only while reads are out, so that the usual
// read costs nothing more.
func (m *memReader) do(pid int, owner func() int, read func() ([]byte, error)) ([]byte, error) {
	m.mu.Lock()
	busy := m.n > 0
	refused := m.refuse(pid, -1)
	m.mu.Unlock()
	if refused != nil {
		return nil, refused
	}
	uid, wait := -1, m.wait
	if busy {
		uid = owner()
		m.mu.Lock()
		refused = m.refuse(pid, uid)
		if m.owners[uid] > 0 {
			wait = min(wait, m.suspect)
		}
		m.mu.Unlock()
		if refused != nil {
			return nil, refused
		}
	}

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
			if m.owners[uid]--; m.owners[uid] == 0 {
				delete(m.owners, uid)
			}
		}
		m.mu.Unlock()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r := <-done:
		return r.data, r.err
	case <-t.C:
	}
	if uid < 0 {
		// Before the lock: the read, if it returns meanwhile, reads
		// uid only once abandoned is set, under the lock.
		uid = owner()
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
	m.owners[uid]++
	m.n++
	return nil, fmt.Errorf("no answer after %v: %w", wait, ErrStalled)
}

// refuse says why pid, of owner uid (-1: not known yet), is not read
// now, or nil. m.mu is held.
func (m *memReader) refuse(pid, uid int) error {
	switch {
	case m.stuck[pid] > 0:
		return fmt.Errorf("pid %d: an earlier read of its memory has not returned: %w", pid, ErrStalled)
	case m.n >= m.most:
		return fmt.Errorf("pid %d: not read while %d reads of processes' memory have not returned: %w", pid, m.n, ErrStalled)
	case uid >= 0 && m.owners[uid] >= m.perOwner:
		return fmt.Errorf("pid %d: not read while %d reads of uid %d's processes' memory have not returned: %w", pid, m.owners[uid], uid, ErrStalled)
	}
	return nil
}

// ReadMemory runs read, a read of the cmdline or environ of pid under
// the procfs root, on a goroutine of its own and returns what it
// returns, or ErrStalled if it has not returned in time (a second, less
// for an owner with reads out: see memReads). read
// must own everything it touches (descriptor, buffer): once abandoned it
// runs on alone, and ends when the process lets go of its lock or is
// gone.
func ReadMemory(root string, pid int, read func() ([]byte, error)) ([]byte, error) {
	return memReads.do(pid, func() int { return ownerOf(root, pid) }, read)
}

// ownerOf is whom pid's stalled reads are counted against: the UID that
// made the outermost user namespace pid runs in below ours, or pid's
// real UID if it runs in ours. A rootless user runs his containers'
// processes as any of his 65,536 subordinate UIDs, each in a namespace
// he made: counted by real UID, he could hold every read there is. -1:
// unknown.
func ownerOf(root string, pid int) int {
	if uid, ok := nsOwner(root, pid); ok {
		return uid
	}
	_, ids, err := readStatus(Dir(root), pid)
	if err != nil {
		return -1
	}
	return ids[0]
}

// nsOwner returns the creator of the outermost user namespace below ours
// that pid runs in; ok is false if pid runs in ours, or its namespace
// cannot be opened (another user's, from a rootless hook).
func nsOwner(root string, pid int) (uid int, ok bool) {
	var ours, st unix.Stat_t
	if unix.Stat(root+"/self/ns/user", &ours) != nil {
		return -1, false
	}
	fd, err := unix.Open(root+"/"+strconv.Itoa(pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false
	}
	defer func() { unix.Close(fd) }()
	same := func(fd int) bool {
		return unix.Fstat(fd, &st) == nil && st.Dev == ours.Dev && st.Ino == ours.Ino
	}
	if same(fd) {
		return -1, false
	}
	for range 32 { // the kernel nests user namespaces 32 deep at most
		parent, err := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		if err != nil {
			break // EPERM: the parent is outside ours
		}
		if same(parent) {
			unix.Close(parent)
			break
		}
		unix.Close(fd)
		fd = parent
	}
	var owner uint32
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&owner))); errno != 0 {
		return -1, false
	}
	return int(owner), true
}

// inMemory reports whether a /proc/<pid>/ file is read from the process's
// memory.
func inMemory(name string) bool {
	return name == "cmdline" || name == "environ"
}
