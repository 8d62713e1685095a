package sockets

import (
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Shared is what the reaps of one decision share of the host, so that a
// burst of a hundred deaths reads each table once, not once a container
// (DESIGN "One view of the host"): each network namespace's unix socket
// table, and the caller's mount table, held in one pathwalk.Guard, which
// reads it again where the mounts changed, as any guard does. Its use is
// safe from several goroutines. Given a nil *Shared, TreeSockets and
// RemoveTreeSockets read tables of their own, as a one-off caller (the
// hook's poststop) wants.
type Shared struct {
	mu     sync.Mutex // held while r is used: a Guard is for one at a time
	r      reach
	closed bool

	tabsMu sync.Mutex
	tabs   map[netNS]*netTable
	// netReads counts the socket tables read, for tests.
	netReads int
}

// netNS names a network namespace by its nsfs inode.
type netNS struct{ dev, ino uint64 }

// netTable is one namespace's table, read by the first member asked of
// it that could be read.
type netTable struct {
	mu sync.Mutex
	nu NetUnix
	ok bool
}

// NewShared returns a Shared for one decision's reaps; Close it after.
func NewShared() *Shared { return &Shared{tabs: map[netNS]*netTable{}} }

// Close lets go of the mount table. A closed Shared's reach refuses
// every path, as a closed Guard does.
func (sh *Shared) Close() {
	if sh == nil {
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.r.close()
	sh.closed = true
}

// reach returns the shared reach, locked, and its unlock.
func (sh *Shared) reach() (*reach, func()) {
	sh.mu.Lock()
	if sh.closed && !sh.r.read {
		// Never read, never to be closed: a guard that refuses all.
		sh.r.read = true
	}
	return &sh.r, sh.mu.Unlock
}

// netUnix is ReadNetUnix through pid, read once per network namespace.
// A failed read is not kept: the next member may be readable (one gone
// meanwhile is not its namespace's end).
func (sh *Shared) netUnix(procRoot string, pid int) (NetUnix, error) {
	var st unix.Stat_t
	if err := unix.Stat(procRoot+"/"+strconv.Itoa(pid)+"/ns/net", &st); err != nil {
		return ReadNetUnix(procRoot, pid)
	}
	k := netNS{dev: uint64(st.Dev), ino: st.Ino}
	sh.tabsMu.Lock()
	t := sh.tabs[k]
	if t == nil {
		t = &netTable{}
		sh.tabs[k] = t
	}
	sh.tabsMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ok {
		return t.nu, nil
	}
	nu, err := ReadNetUnix(procRoot, pid)
	sh.tabsMu.Lock()
	sh.netReads++
	sh.tabsMu.Unlock()
	if err != nil {
		return nil, err
	}
	t.nu, t.ok = nu, true
	return nu, nil
}
