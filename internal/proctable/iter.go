package proctable

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
)

// listBPF lists with the BPF task iterator: every process's group and
// start time and every leader's state and comm in one stream, with no
// file read.
//
// The iterator is not trusted to list every process: it has been seen to
// leave some out (PID 1 on this project's VMs), and a member it missed
// would be missing from the decisions about its group (a second
// container's ID, another UID, a younger age). Unless the pass's census
// proves that every process was listed (see vouch), the listing is left
// pending: Confirm lists /proc and adds every process /proc shows that
// the iterator did not, so that any process that exists for the whole
// listing is in it, as with the /proc lister.
func listBPF(opt Options) (*Listing, error) {
	r := newPassReader(opt)
	defer r.Close()
	p := opt.Program
	if p == nil {
		load := taskiter.Load
		if opt.LayoutCache != "" {
			load = func() (*taskiter.Program, error) { return taskiter.LoadCached(opt.LayoutCache) }
		}
		var err error
		if p, err = load(); err != nil {
			return nil, err
		}
		defer p.Close()
	}
	var l *Listing
	for passes := 1; ; passes++ {
		var census taskiter.Census
		var tasks int
		var sawInit bool
		var err error
		l, census, tasks, sawInit, err = pass(p, opt)
		if err != nil {
			return nil, err
		}
		if opt.churn != nil {
			opt.churn(&census)
		}
		l.Passes = passes
		r.watched = nil
		listed := len(l.PIDs)
		l.ascending = listed
		if l.Unvouched = l.vouch(r, &census, tasks, sawInit); l.Unvouched != "" {
			// A host whose processes came and went during the pass
			// is likely still within a few milliseconds: the walk is
			// run again, up to churnPasses in all, before /proc is
			// listed (40 ms at 10,000 processes, the walk 4).
			if l.Unvouched == churned && p.Walks() && passes < churnPasses {
				continue
			}
			l.pending = &confirmation{}
		}
		l.iterSeen = len(l.PIDs)
		l.Watched = append(l.Watched, r.watched...)
		l.Missed = len(l.PIDs) - listed
		l.StatReads += r.statReads
		return l, nil
	}
}

// churnPasses bounds the walks of a listing whose census the host's
// changes keep from vouching.
const churnPasses = 3

// churned is vouch's answer when the census was inexact.
const churned = "processes came and went during the pass"

// pass lists the host with p into a new Listing, and returns it with the
// pass's census, the listed processes' threads and whether PID 1 was
// among them.
func pass(p *taskiter.Program, opt Options) (l *Listing, census taskiter.Census, tasks int, sawInit bool, err error) {
	l = &Listing{Lister: "bpf", root: opt.Root, named: opt.Named, watch: opt.Watch, Method: p.Method()}
	l.reserve(expectProcesses())
	census, err = p.Each(func(t *taskiter.Task) {
		if opt.Hide != nil && opt.Hide(t.PID) {
			return
		}
		tasks += t.Threads
		sawInit = sawInit || t.PID == 1
		l.add(t.PID, t.PGID, t.StartTicks, t.PPID, t.UID)
		var comm [16]byte
		copy(comm[:], t.Comm())
		l.comms = append(l.comms, comm[:]...)
		l.dead = append(l.dead, t.Zombie())
		// Indexing the map or asking Watch with the converted bytes
		// does not allocate; only a kept comm becomes a string.
		if opt.Watch != nil && opt.Watch(t.Comm()) {
			l.Watched = append(l.Watched, Proc{PID: t.PID, PPID: t.PPID, PGID: t.PGID, UID: t.UID, StartTicks: t.StartTicks, Comm: string(t.Comm()), Zombie: t.Zombie()})
		}
		if t.PGID != t.PID {
			return
		}
		ld := Leader{PID: t.PID}
		if !t.Zombie() {
			ld.State = Live
			if comm := t.Comm(); opt.Named[string(comm)] {
				ld.Comm = string(comm)
			}
		}
		l.Leaders = append(l.Leaders, ld)
	})
	return l, census, tasks, sawInit, err
}

// vouch checks that the pass's census proves that l lists every process,
// tasks being the sum of the listed processes' threads, and says why not
// when it does not. The one
// process the iterator is known to leave out, PID 1 (on this project's
// VMs), is read from /proc when missing and added to l if that accounts
// for every unlisted task. The census is re-read after that read, so that
// a change to the process table meanwhile cannot pass for the proof.
func (l *Listing) vouch(r *passReader, census *taskiter.Census, tasks int, sawInit bool) string {
	var init fingerprint.Stat
	probed := false
	// PID 1 by name: on this project's 6.18 Firecracker VMs the kernel
	// withholds PID 1's whole thread group from task iterators, as it
	// shields it from ptrace-mode access, and nothing else
	// (DESIGN "PID 1 and the iterator"). Reading it here lets the census vouch for such a
	// pass; any other absence still fails the census below.
	if !sawInit {
		st, err := r.Stat(1)
		if err != nil {
			return fmt.Sprintf("it left out PID 1, which could not be read: %v", err)
		}
		init, probed = st, true
		tasks += st.Threads
	}
	if err := census.Recheck(); err != nil {
		return err.Error()
	}
	switch n, exact := census.Unlisted(tasks); {
	case !exact:
		return churned
	case n != 0:
		return fmt.Sprintf("it left out processes holding %d task(s)", n)
	}
	if probed {
		l.add(1, init.PGID, 0, init.PPID, -1)
		if init.PGID == 1 {
			l.Leaders = append(l.Leaders, r.leader(1))
		} else if r.watch != nil && r.watch([]byte(init.Comm)) {
			r.watched = append(r.watched, procOf(init))
		}
	}
	return ""
}

// confirmation is the /proc listing that checks the task iterator's. It
// may start early (Prefetch) and run while the caller reads what the
// listing has.
type confirmation struct {
	done   chan struct{}
	listed []int
	err    error
}

// Pending reports whether the listing awaits Confirm: the census could
// not vouch for the task iterator's pass, and Options.Defer was set.
func (l *Listing) Pending() bool { return l.pending != nil }

// Prefetch starts listing /proc for Confirm, if the listing is pending.
// The listing must not be read while Confirm runs, but may be meanwhile.
func (l *Listing) Prefetch() {
	c := l.pending
	if c == nil || c.done != nil {
		return
	}
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.listed, c.err = PIDs(l.root)
	}()
}

// Confirm completes a pending listing: it adds what /proc listed and the
// iterator did not, and returns how many of those are in a process group
// (kernel threads are in none, and a process gone since is in none any
// more: they change nothing a group's decisions read; PID 1 is, in its
// own). It does nothing to a listing that is complete.
func (l *Listing) Confirm() (grouped int, err error) {
	c := l.pending
	if c == nil {
		return 0, nil
	}
	l.Prefetch()
	<-c.done
	if c.err != nil {
		return 0, c.err
	}
	l.pending = nil
	l.Confirmed = true
	r := newPassReader(Options{Root: l.root, Named: l.named, Watch: l.watch})
	defer r.Close()
	l.Missed, grouped = l.addMissed(r, c.listed)
	l.StatReads += r.statReads
	l.Watched = append(l.Watched, r.watched...)
	return grouped, nil
}

// addMissed adds the processes of listed (ascending, as /proc lists them)
// that the iterator's listing (ascending too) does not have. It returns
// how many it added, and how many of those are in a process group.
func (l *Listing) addMissed(r *passReader, listed []int) (missed, grouped int) {
	seen := l.PIDs // the iterator's, before anything is appended
	if !slices.IsSorted(seen) {
		seen = slices.Sorted(slices.Values(seen))
	}
	j := 0
	for _, pid := range listed {
		for j < len(seen) && seen[j] < pid {
			j++
		}
		if j < len(seen) && seen[j] == pid {
			continue
		}
		missed++
		// Its parent and start too: a listing with parent links is
		// walked through them alone (a tree's escaped children, a
		// monitor's container init), and one missed there hides what
		// runs below it.
		st, err := r.stat(pid)
		pgid, ppid, start := -1, -1, uint64(0)
		if err == nil {
			pgid, ppid, start = st.PGID, st.PPID, st.StartTicks
		} else {
			if !errors.Is(err, fingerprint.ErrNotFound) {
				l.PPIDsPartial = true
			}
			if v, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pid), 0, 0); errno == 0 {
				pgid = int(v)
			}
		}
		if pgid > 0 {
			grouped++
		}
		l.add(pid, pgid, start, ppid, -1)
		if pgid == pid {
			l.Leaders = append(l.Leaders, r.leaderFrom(pid, st, err))
		}
	}
	return missed, grouped
}
