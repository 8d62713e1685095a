package pgkill

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// Members lists the live processes (not zombies, not threads) whose
// process group is one of pgids now, ordered by PID. On the host's /proc
// it groups processes with getpgid(2) and reads stat files only for
// members; under any other root it reads every stat file. A listing that
// cannot be read is empty: callers poll it.
func Members(root string, pgids ...int) []fingerprint.Stat {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	pids, err := proctable.PIDs(root)
	if err != nil {
		return nil
	}
	host := root == fingerprint.DefaultRoot
	var out []fingerprint.Stat
	for _, pid := range pids {
		if host {
			g, err := unix.Getpgid(pid)
			if err != nil || !slices.Contains(pgids, g) {
				continue
			}
		}
		st, err := fingerprint.ReadStat(root, pid)
		if err != nil || !slices.Contains(pgids, st.PGID) || st.Zombie() {
			continue
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b fingerprint.Stat) int { return a.PID - b.PID })
	return out
}

// OthersResult reports what KillOthers did.
type OthersResult struct {
	// Outlived are the members still alive when the grace ended; each
	// got SIGKILL.
	Outlived []fingerprint.Stat
	// Left are the members still alive after SIGKILL and KillWait.
	Left []fingerprint.Stat
	// Refused counts the signals not sent because the member could not
	// be re-verified (gone, recycled, left the groups) or refused them.
	Refused int
}

// KillOthers takes down every process of groups except the caller, which
// is in one of them: kc-hook's supervise wrapper leads the group it
// answers for and must outlive it. killpg would reach the caller too, so
// it signals member by member, each through a pidfd after re-verifying
// it (signalMember): SIGTERM to every member, listing the groups again
// every opt.Poll so that members appearing meanwhile get theirs, until
// none is left or opt.Grace has passed; then the same with SIGKILL for
// up to opt.KillWait.
//
// The caller must know the group numbers are its own: the groups are
// listed by number. The wrapper's own group is held by the wrapper; a
// child's group, by the child while it is unreaped.
func KillOthers(groups []int, opt Options) OthersResult {
	opt = opt.withDefaults()
	var res OthersResult
	res.Outlived = othersPhase(opt, groups, unix.SIGTERM, opt.Grace, &res.Refused)
	if len(res.Outlived) == 0 {
		return res
	}
	res.Left = othersPhase(opt, groups, unix.SIGKILL, opt.KillWait, &res.Refused)
	return res
}

// othersPhase sends sig once to each member of groups but the caller,
// looking again every opt.Poll or as soon as every signalled member has
// exited (their pidfds: a tree dies in a few ms, and a fixed tick made
// every teardown last one tick), and returns the members still alive
// when wait ran out (nil once none is left). Each look lists the members
// (opt.Members, else /proc with a getpgid per process on the host): it
// waits for them all, not the first, or a burst of a hundred teardowns
// lists them hundreds of times.
func othersPhase(opt Options, groups []int, sig syscall.Signal, wait time.Duration, refused *int) []fingerprint.Stat {
	self := os.Getpid()
	deadline := time.Now().Add(wait)
	w := newExitWatch(opt.Root)
	defer w.close()
	proc := func(groups []int) []fingerprint.Stat { return Members(opt.Root, groups...) }
	list, confirm := opt.Members, opt.Confirm
	if list == nil {
		list = proc
	}
	if confirm == nil {
		confirm = proc
	}
	sent := map[fingerprint.Stat]bool{}
	notSelf := func(m fingerprint.Stat) bool { return m.PID == self }
	for {
		ms := slices.DeleteFunc(list(groups), notSelf)
		if len(ms) == 0 && opt.Members != nil {
			// A lister's "none left" is what ends the phase: it is
			// checked, once per phase rather than at every look.
			ms = slices.DeleteFunc(confirm(groups), notSelf)
		}
		if len(ms) == 0 {
			return nil
		}
		for _, m := range ms {
			key := fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks}
			if sent[key] {
				continue
			}
			sent[key] = true
			if signalMember(opt.Root, m, groups, opt.MemberUIDs, sig) != nil {
				*refused++
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return ms
		}
		look := time.Now().Add(min(opt.Poll, left))
		for {
			w.wait(context.Background(), ms, time.Until(look))
			if !w.watching() || !time.Now().Before(look) {
				break
			}
		}
	}
}

// signalMember signals m through a pidfd after re-verifying, with the
// pidfd open, that it is the listed process and still in one of groups,
// and that it is not the caller; with uids, that it still runs wholly as
// one of them (a member that ran a setuid program since it was listed is
// another user's now). Without a pidfd it signals nothing: a kill(2) by
// PID after a check could reach whatever took the PID in between
// (kernels without pidfd_open are below the project's minimum).
func signalMember(root string, m fingerprint.Stat, groups []int, uids []int, sig syscall.Signal) error {
	if m.PID == os.Getpid() {
		return fmt.Errorf("pid %d is the calling process; it is never signalled", m.PID)
	}
	pin, err := fingerprint.Pin(root, m)
	if err != nil {
		return err
	}
	defer pin.Close()
	if !slices.Contains(groups, pin.PGID) {
		return fmt.Errorf("pid %d left the group", m.PID)
	}
	as := 0
	if len(uids) > 0 {
		if as, err = runsAsOneOf(root, m, uids); err != nil {
			return fmt.Errorf("member %d: %w", m.PID, err)
		}
	}
	_, err = asUID(as, func() error { return pin.Signal(sig) })
	return err
}
