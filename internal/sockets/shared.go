package sockets

import (
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Shared is what the reaps of one decision share of the host, so that a
// burst of a hundred deaths reads each table about once, not once a
// container (DESIGN "One view of the host"): each network namespace's
// unix socket table, and the caller's mount table, held in a
// pathwalk.Guard, which reads it again where the mounts changed, as any
// guard does. A guard serves guardUses uses (a lookup's or an unlink
// batch's walks), then a new one is read:
// its re-read budget is for a few walks, and on a drain's node, whose
// mounts keep changing, one budget spent by the whole decision would
// leave its last reaps' sockets refused. Its use is safe from several
// goroutines. Given a nil *Shared, TreeSockets and RemoveTreeSockets
// read tables of their own, as a one-off caller (the hook's poststop)
// wants.
type Shared struct {
	mu     sync.Mutex // held while r is used: a Guard is for one at a time
	r      reach
	uses   int
	closed bool
	// guards counts the guards handed out, for tests.
	guards int

	tabsMu sync.Mutex
	tabs   map[netNS]*netTable
	// netReads counts the socket tables read, for tests.
	netReads int
}

// guardUses is how many uses (calls, not walks) a shared guard serves.
const guardUses = 8

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

// reacher hands a call the reach it walks paths with: sh's, under its
// lock, or, without sh, one of the call's own.
type reacher struct {
	sh  *Shared
	own reach
}

func (rc *reacher) get() (*reach, func()) {
	if rc.sh == nil {
		return &rc.own, func() {}
	}
	return rc.sh.reach()
}

func (rc *reacher) close() {
	if rc.sh == nil {
		rc.own.close()
	}
}

// reach returns the shared reach, locked, and its unlock.
func (sh *Shared) reach() (*reach, func()) {
	sh.mu.Lock()
	switch {
	case sh.closed:
		// Never again read: the zero Guard, or a closed one, refuses all.
		sh.r.read = true
	case sh.uses == 0 || sh.uses >= guardUses:
		sh.r.close()
		sh.r, sh.uses = reach{}, 0
		sh.guards++
	}
	sh.uses++
	return &sh.r, sh.mu.Unlock
}

// netUnix is ReadNetUnix through pid, read once per network namespace
// with sh. A failed read is not kept (the next member may be readable),
// nor one whose PID went to another namespace meanwhile.
func (sh *Shared) netUnix(procRoot string, pid int) (NetUnix, error) {
	if sh == nil {
		return ReadNetUnix(procRoot, pid)
	}
	ns := procRoot + "/" + strconv.Itoa(pid) + "/ns/net"
	k, err := netNSOf(ns)
	if err != nil {
		return ReadNetUnix(procRoot, pid)
	}
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
	if after, err := netNSOf(ns); err == nil && after == k {
		t.nu, t.ok = nu, true
	}
	return nu, nil
}

// netNSOf names the network namespace at ns, a /proc/<pid>/ns/net.
func netNSOf(ns string) (netNS, error) {
	var st unix.Stat_t
	if err := unix.Stat(ns, &st); err != nil {
		return netNS{}, err
	}
	return netNS{dev: uint64(st.Dev), ino: st.Ino}, nil
}
