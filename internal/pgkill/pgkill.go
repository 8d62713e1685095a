// Package pgkill kills a process group without ever signalling a group that
// the caller did not record.
//
// Between the scan that found a group and the signal that ends it, any of
// its members may exit and their numbers be handed to unrelated processes.
// A process group number stays allocated while at least one process (even a
// zombie) holds it, so a group is provably the recorded one as long as one
// original member — same PID, same start time, same PGID — is still in it.
// Before every killpg this package pins such a member with a pidfd, stops it
// (a stopped process cannot exit on its own, so the group cannot empty and
// be reborn under us), re-verifies it, and only then signals the group.
//
// Processes can join the group after the scan: a child a member forked a
// moment before the kill inherits the PGID. They get the group's SIGTERM,
// but if every original dies of it while a joiner ignores it, no original
// is left to vouch for the group's SIGKILL. Once the originals are dead,
// Kill therefore looks for live processes still in the group and runs the
// same SIGTERM, grace, SIGKILL on them, with them as the recorded members
// — a few rounds at most. It only takes what it finds there for the
// recorded group's while that is proven: the leader's pidfd still reaches
// a non-empty group (its struct pid is the group's and, unlike the
// number, is never given to a later group), or a recorded process, alive
// or a zombie, is still in it after the search.
//
// pgkill and fingerprint are the only packages that signal other
// processes (TestOnlyPgkillAndFingerprintSignal holds the rest of the
// shipped code to it), so the pidfd rules live in one place. A caller
// inside the group it takes down — kc-hook's supervise wrapper — uses
// KillOthers, which never signals the caller.
package pgkill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// Group is a recorded process group: its ID and the identities of the
// members seen when it was scanned.
type Group struct {
	PGID    int
	Members []fingerprint.Stat
}

// Options tune Kill. The zero value is usable.
type Options struct {
	// Root is the procfs mount; default /proc.
	Root string
	// Grace is how long to wait after SIGTERM before SIGKILL; default 5s.
	Grace time.Duration
	// Poll is the longest wait between liveness checks; default 20ms.
	// A member's exit ends the wait early when it could be pinned.
	Poll time.Duration
	// KillWait bounds the wait after SIGKILL; default 3s.
	KillWait time.Duration
	// Members, when set, is how KillOthers finds the groups' members
	// instead of listing /proc (Members) at every look; a look at which
	// it finds none is checked (Confirm, else /proc) before the phase
	// ends. A
	// listing costs a getpgid per process on the host, and a burst of a
	// hundred teardowns, each looking a few times, starved the host's
	// other work for seconds. A caller that knows where the members are
	// (kc-hook's wrapper; see internal/supervise) sets it. Each member
	// found is still re-verified before its signal.
	Members func(groups []int) []fingerprint.Stat
	// Confirm, with Members, is what checks a look at which Members
	// found none; nil lists /proc. A caller may set it only where it
	// sees every member Members could have missed (the wrapper: the
	// cgroup its command was started in).
	Confirm func(groups []int) []fingerprint.Stat
	// UID, with CheckUID, is the UID every process Kill sees in a group
	// must run as (real, effective and saved) when it is signalled: a
	// recorded member that ran a setuid program since it was recorded,
	// or a joiner found running as another, makes Kill signal nothing more (the group is not one UID's tree any
	// more; DESIGN "Identity rules"). The group's signals go out as UID
	// (killpgAs): a process that joined unseen gets them only if UID
	// could have sent them itself.
	UID      int
	CheckUID bool
	// MemberUIDs, when set, are the UIDs KillOthers signals members
	// running wholly as, checked through the pidfd right before each
	// signal; others are refused.
	MemberUIDs []int

	// seams let a test act at moments only Kill knows; zero outside tests.
	seams joinerSeams
}

// joinerSeams run before Kill searches the group for joiners, and between
// finding joiners and signalling them.
type joinerSeams struct {
	beforeScan func(round int)
	found      func(round int, found []fingerprint.Stat)
	// searched runs when the group is searched through /proc.
	searched func(round int)
}

// DefaultGrace is the wait between SIGTERM and SIGKILL when none is set:
// kc-hook's and kc-janitor's --kill-grace default, and every Options'.
const DefaultGrace = 5 * time.Second

func (o Options) withDefaults() Options {
	if o.Root == "" {
		o.Root = fingerprint.DefaultRoot
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Millisecond
	}
	if o.KillWait <= 0 {
		o.KillWait = 3 * time.Second
	}
	return o
}

// Result reports what Kill did to one group.
type Result struct {
	PGID int
	// Outcome is one of three. action.Reaped: the group was signalled,
	// every original member is dead and no live process is left in it
	// (zombies count as dead). action.Gone: no original member occupied
	// the group any more; nothing was signalled. action.WouldNotDie:
	// signalling failed (EPERM), members survived SIGKILL, processes were
	// still in the group after the last round, or the group could not be
	// searched or proven to be the recorded one.
	Outcome action.Action
	// Signals lists the signals that were sent to the group, in order,
	// those of the rounds for joiners included.
	Signals []syscall.Signal
	// Joiners are the live processes found in the group once everything
	// signalled before them was dead: they joined it after it was
	// recorded. Each round of them got SIGTERM, grace, SIGKILL in turn.
	Joiners []fingerprint.Stat
	Err     error
}

// maxJoinerRounds bounds the rounds for joiners: a group that keeps
// gaining processes is reported rather than chased for ever.
const maxJoinerRounds = 3

// pidfdSignalProcessGroup is PIDFD_SIGNAL_PROCESS_GROUP from
// <linux/pidfd.h> (Linux 6.9); golang.org/x/sys does not define it.
const pidfdSignalProcessGroup = 1 << 2

// errNoOccupant means no recorded member is in the group any more.
var errNoOccupant = errors.New("no recorded member occupies the group")

// Kill sends SIGTERM to the group, waits up to the grace for every original
// member to die, then sends SIGKILL; then it does the same to processes
// that joined the group meanwhile (see the package comment). Each signal
// is preceded by the revalidation described there. Kill honours ctx: when
// it expires the group is killed at once and the result reflects the state
// at that point.
func Kill(ctx context.Context, g Group, opt Options) Result {
	opt = opt.withDefaults()
	res := Result{PGID: g.PGID}
	if g.PGID <= 1 || len(g.Members) == 0 {
		res.Outcome = action.WouldNotDie
		res.Err = fmt.Errorf("refusing to signal group %d with %d recorded members", g.PGID, len(g.Members))
		return res
	}
	k := &killer{opt: opt, pgid: g.PGID, res: &res}
	defer k.close()
	res.Outcome, res.Err = k.round(ctx, g.Members)
	switch {
	case res.Outcome == action.Reaped:
		res.Outcome, res.Err = k.joiners(ctx, g.Members)
	case res.Outcome == action.Gone && !numberReused(opt.Root, g):
		// The recorded members died before the first signal, but a
		// process that joined the group after it was recorded (a
		// kernel's worker started since the scan) may live on in it.
		if outcome, err := k.joiners(ctx, g.Members); err != nil || len(res.Joiners) > 0 {
			res.Outcome, res.Err = outcome, err
		}
	}
	return res
}

// GroupEmpty reports whether no process, zombies included, is in group
// pgid now (whichever group holds the number).
func GroupEmpty(pgid int) bool {
	return pgid > 1 && errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

// numberReused reports whether the group's number is held by a process
// that got it after the recorded group had emptied: a group's number is
// its leader's PID, allocated as long as the group has a process, so a
// process of that PID born after every recorded member is not the
// recorded group's. Whatever is in the group now is not ours. (A process
// born before them may be the group's own leader, left out of the record
// when its argv could not be read.)
func numberReused(root string, g Group) bool {
	st, err := fingerprint.ReadStat(root, g.PGID)
	if err != nil {
		return false
	}
	newest := uint64(0)
	for _, m := range g.Members {
		if fingerprint.Same(m, st) {
			return false
		}
		newest = max(newest, m.StartTicks)
	}
	return st.StartTicks > newest
}

// killer is one Kill in progress.
type killer struct {
	opt  Options
	pgid int
	res  *Result
	// leader is the recorded leader, pinned while it was verified in the
	// group. Its struct pid is the group's, so its pidfd can ask whether
	// the recorded group, and not whatever holds the number now, still
	// has processes. Nil when the leader was not recorded or not pinned.
	leader *fingerprint.Pinned
	// noGroupProbe: the kernel cannot address a group through a pidfd.
	noGroupProbe bool
	// graceEnd and killEnd are set by the first SIGTERM and SIGKILL: the
	// rounds for joiners share the budget of the first round rather than
	// adding theirs to it.
	graceEnd, killEnd time.Time
}

func (k *killer) close() {
	if k.leader != nil {
		k.leader.Close()
	}
}

// round sends SIGTERM, waits until members are dead or the grace is over,
// then sends SIGKILL and waits for them again.
func (k *killer) round(ctx context.Context, members []fingerprint.Stat) (action.Action, error) {
	g := Group{PGID: k.pgid, Members: members}
	err := k.signalGroup(members, unix.SIGTERM)
	switch {
	case errors.Is(err, errNoOccupant):
		return k.leftGroup(ctx, g, action.Gone)
	case err != nil:
		return action.WouldNotDie, err
	}
	k.res.Signals = append(k.res.Signals, unix.SIGTERM)
	if k.graceEnd.IsZero() {
		k.graceEnd = time.Now().Add(k.opt.Grace)
	}

	graceCtx, cancel := context.WithDeadline(ctx, k.graceEnd)
	dead := waitDead(graceCtx, k.opt, g)
	cancel()
	if dead {
		return action.Reaped, nil
	}

	err = k.signalGroup(members, unix.SIGKILL)
	switch {
	case errors.Is(err, errNoOccupant):
		// The last member died between the poll and the revalidation,
		// or the living ones left the group during the grace (setsid).
		return k.leftGroup(ctx, g, action.Reaped)
	case err != nil:
		return action.WouldNotDie, err
	}
	k.res.Signals = append(k.res.Signals, unix.SIGKILL)
	if k.killEnd.IsZero() {
		k.killEnd = time.Now().Add(k.opt.KillWait)
	}
	// Members that left the group during the grace (setsid) while others
	// held it: out of the group's SIGKILL, still the tree's.
	out := outside(k.opt.Root, members, k.pgid)
	if len(out) > 0 && !k.opt.CheckUID {
		return action.WouldNotDie, fmt.Errorf("group %d: %s left it, alive: not signalled", k.pgid, describe(out))
	}
	var escErr error
	if len(out) > 0 {
		opt := k.opt
		opt.Grace = time.Nanosecond // they had the group's SIGTERM and grace
		if r := KillEscaped(ctx, out, k.opt.UID, opt); r.Outcome == action.WouldNotDie {
			escErr = fmt.Errorf("group %d: members that left it: %w", k.pgid, r.Err)
		}
	}

	// SIGKILL cannot be ignored; the wait only covers the kernel tearing
	// the processes down. It is bounded even when ctx has already expired.
	killCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), k.killEnd)
	defer cancel()
	if waitDead(killCtx, k.opt, g) {
		return action.Reaped, nil
	}
	return action.WouldNotDie, errors.Join(escErr, fmt.Errorf("group %d: still alive after SIGKILL: %s", k.pgid, describe(alive(k.opt.Root, g))))
}

// outside returns the members alive, still the recorded processes, that
// are no longer in group pgid.
func outside(root string, members []fingerprint.Stat, pgid int) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range members {
		if st, err := fingerprint.Revalidate(root, m); err == nil && !st.Zombie() && st.PGID != pgid {
			out = append(out, m)
		}
	}
	return out
}

// leftGroup settles a round none of whose members occupies the group any
// more: outcome if they are all dead; those alive left it (setsid), out
// of the group's signals' reach but recorded, so still the tree's. With
// Options.CheckUID they are killed one by one as escaped members are
// (KillEscaped: a pidfd each, the tree's UID); without, reported.
func (k *killer) leftGroup(ctx context.Context, g Group, outcome action.Action) (action.Action, error) {
	left := alive(k.opt.Root, g)
	if len(left) == 0 {
		return outcome, nil
	}
	if !k.opt.CheckUID {
		return action.WouldNotDie, fmt.Errorf("group %d: %s left it, alive: not signalled", k.pgid, describe(left))
	}
	opt := k.opt
	if !k.graceEnd.IsZero() {
		// They had the group's SIGTERM: what is left of its grace.
		opt.Grace = max(time.Until(k.graceEnd), time.Nanosecond)
	}
	r := KillEscaped(ctx, left, k.opt.UID, opt)
	switch r.Outcome {
	case action.WouldNotDie:
		return r.Outcome, fmt.Errorf("group %d: members that left it: %w", k.pgid, r.Err)
	case action.Reaped:
		return action.Reaped, nil
	}
	return outcome, nil
}

// joiners runs rounds on the processes found in the group once the
// members of the round before are dead, until none is left. known are
// the processes recorded so far: any of them still in the group proves it
// is the recorded one.
func (k *killer) joiners(ctx context.Context, known []fingerprint.Stat) (action.Action, error) {
	known = known[:len(known):len(known)] // never append into the caller's slice
	for round := 1; ; round++ {
		found, err := k.findJoiners(round, known)
		switch {
		case err != nil:
			return action.WouldNotDie, err
		case len(found) == 0:
			return action.Reaped, nil
		case round > maxJoinerRounds:
			return action.WouldNotDie, fmt.Errorf("group %d: processes kept joining it; still in it after %d rounds of signals to joiners: %s",
				k.pgid, maxJoinerRounds, describe(found))
		}
		k.res.Joiners = append(k.res.Joiners, found...)
		known = append(known, found...)
		if f := k.opt.seams.found; f != nil {
			f(round, found)
		}
		// Gone: they exited or left before they could be pinned; look
		// again all the same, for what they may have forked.
		if outcome, err := k.round(ctx, found); outcome == action.WouldNotDie {
			return outcome, fmt.Errorf("processes that joined group %d after it was recorded: %w", k.pgid, err)
		}
	}
}

// findJoiners returns the live processes in the recorded group now. It
// searches /proc by number, so it returns them only once it has proven
// the number still names the recorded group: a group that emptied gives
// up its number, which a later group can take once its leader's PID is
// handed out again.
func (k *killer) findJoiners(round int, known []fingerprint.Stat) ([]fingerprint.Stat, error) {
	if f := k.opt.seams.beforeScan; f != nil {
		f(round)
	}
	// The common case, an empty group, costs no search; nor does a group
	// that only held recorded zombies, once their parents reap them.
	empty := func() bool {
		switch k.recordedGroup() {
		case groupEmpty:
			return true
		case groupUnknown:
			return errors.Is(unix.Kill(-k.pgid, 0), unix.ESRCH)
		}
		return false
	}
	if empty() {
		return nil, nil
	}
	k.settle(known)
	if empty() {
		return nil, nil
	}
	if f := k.opt.seams.searched; f != nil {
		f(round)
	}
	found, err := scanGroup(k.opt.Root, k.pgid)
	if err != nil {
		return nil, fmt.Errorf("group %d: searching it for processes that joined it after it was recorded: %w", k.pgid, err)
	}
	if len(found) == 0 {
		return nil, nil // zombies only: dead, waiting for their parent
	}
	// Asked after the search: a group that has processes now has had
	// them all along, so the number was its own during the search.
	switch k.recordedGroup() {
	case groupLive:
		return found, k.owned(found)
	case groupEmpty:
		// Whatever holds the number now is not ours, and nothing of
		// ours is left.
		return nil, nil
	}
	if witnessed(k.opt.Root, k.pgid, known) {
		return found, k.owned(found)
	}
	return nil, fmt.Errorf("group %d: %s joined it after it was recorded, but no recorded process is left in it to prove it is still the recorded group; not signalled",
		k.pgid, describe(found))
}

type groupState int

const (
	groupUnknown groupState = iota // no pinned leader, or no kernel support
	groupLive
	groupEmpty
)

// recordedGroup asks through the pinned leader's pidfd whether the
// recorded group still has processes, zombies included.
func (k *killer) recordedGroup() groupState {
	if k.leader == nil || k.noGroupProbe {
		return groupUnknown
	}
	err := unix.PidfdSendSignal(k.leader.Fd(), 0, nil, pidfdSignalProcessGroup)
	switch {
	case err == nil, errors.Is(err, unix.EPERM):
		// EPERM: it has processes, none of which we may signal.
		return groupLive
	case errors.Is(err, unix.ESRCH):
		return groupEmpty
	}
	// EINVAL: a kernel before 6.9 has no such flag.
	k.noGroupProbe = true
	return groupUnknown
}

// witnessed reports whether one of the recorded processes, alive or a
// zombie, is still in the group: then the group has not emptied since it
// was recorded, and its number is still its own.
func witnessed(root string, pgid int, known []fingerprint.Stat) bool {
	for _, m := range known {
		if st, err := fingerprint.Revalidate(root, m); err == nil && st.PGID == pgid {
			return true
		}
	}
	return false
}

// scanGroup returns the live processes whose group is pgid now. Zombies
// are left out: they have exited and only wait for their parent.
func scanGroup(root string, pgid int) ([]fingerprint.Stat, error) {
	var pids []int
	var err error
	if root == fingerprint.DefaultRoot {
		// getpgid(2) spares reading every process's stat, but it
		// answers for this process's PID namespace, which another
		// procfs need not show.
		pids, err = proctable.InGroup(pgid)
	} else {
		pids, err = proctable.PIDs(root)
	}
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	self := os.Getpid()
	var found []fingerprint.Stat
	for _, pid := range pids {
		st, err := fingerprint.ReadStat(root, pid)
		if err == nil && (st.PGID != pgid || st.Zombie()) {
			continue
		}
		if err == nil {
			// A thread ID is not a process of its own; its process is
			// listed under its own number.
			st, err = fingerprint.Revalidate(root, st)
		}
		switch {
		case notOccupying(err):
			continue
		case err != nil:
			// Its group cannot be told: it may be one of ours.
			return nil, err
		case st.PGID != pgid || st.Zombie():
			continue
		case pid == self:
			// Signalling it would stop or kill the caller itself.
			return nil, fmt.Errorf("the calling process (%d) is in the group itself; it is never signalled", pid)
		}
		found = append(found, st)
	}
	return found, nil
}

// signalGroup sends sig to the group only while a pinned, stopped member
// proves the group is the recorded one.
func (k *killer) signalGroup(members []fingerprint.Stat, sig syscall.Signal) error {
	var unsure error
	owned := func() error { return k.owned(members) }
	for _, m := range leaderFirst(k.pgid, members) {
		err := k.signalVia(m, sig, owned)
		if outOfDescriptors(err) && k.releaseLeader(m) {
			err = k.signalVia(m, sig, owned)
		}
		var u unsureError
		switch {
		case errors.Is(err, errNoOccupant):
			continue
		case errors.As(err, &u):
			// Could not tell (no pidfd support, out of descriptors, an
			// unreadable /proc entry): not proof the member is gone.
			// Try the others, but never report the group gone.
			unsure = u.err
			continue
		}
		return err
	}
	if unsure != nil {
		return fmt.Errorf("group %d: cannot verify its members: %w", k.pgid, unsure)
	}
	return errNoOccupant
}

// owned checks, with Options.CheckUID, that each of procs still in the
// group has the tree's UID as its real, effective and saved UID (a
// setuid program keeps its caller's real UID). One whose UIDs cannot be
// read is not vouched for either.
func (k *killer) owned(procs []fingerprint.Stat) error {
	if !k.opt.CheckUID {
		return nil
	}
	for _, p := range procs {
		ids, err := uidsOf(k.opt.Root, k.pgid, p)
		switch {
		case errors.Is(err, errNoOccupant), errors.Is(err, fingerprint.ErrNotFound):
			// Not in the group now: its signals do not reach it.
		case err != nil:
			return fmt.Errorf("group %d: cannot read the UIDs of %d(%s): %w", k.pgid, p.PID, p.Comm, err)
		case k.opt.UID < 0 || fingerprint.SoleUID(ids) != k.opt.UID:
			// A tree of no known UID vouches for nobody: SoleUID's -1
			// for a setuid member must not match it.
			return fmt.Errorf("group %d: %d(%s) runs as uid %d (real, effective, saved: %v) now, not the tree's %d: %w",
				k.pgid, p.PID, p.Comm, ids[1], ids, k.opt.UID, errOtherUID)
		}
	}
	return nil
}

// errOtherUID marks a group holding a process of a UID other than the
// tree's: it is not signalled.
var errOtherUID = errors.New("not signalled")

// uidsOf reads the UIDs of p, if p is still that process and in group
// pgid (read between two of its identity, so that they are p's).
func uidsOf(root string, pgid int, p fingerprint.Stat) ([3]int, error) {
	ids, err := fingerprint.ReadUIDs(root, p.PID)
	if err != nil {
		return ids, err
	}
	st, err := fingerprint.Revalidate(root, p)
	switch {
	case err != nil && !notOccupying(err):
		// Not known to be gone: its UIDs, just read, may be another's.
		return ids, err
	case err != nil || st.PGID != pgid || st.Zombie():
		return ids, errNoOccupant
	}
	return ids, nil
}

// signalVia signals the group while m, pinned, is verified in it and
// owned says its processes are the tree's. The leader's pin is kept for
// recordedGroup.
func (k *killer) signalVia(m fingerprint.Stat, sig syscall.Signal, owned func() error) error {
	held := k.leader != nil && fingerprint.Same(k.leader.Stat, m)
	var pin *fingerprint.Pinned
	var err error
	if held {
		// As occupant checks a fresh pin: a signal through the pidfd of
		// a zombie "succeeds" and would have us wait for it to stop.
		pin, err = k.leader, k.leaderOccupies()
	} else {
		pin, err = occupant(k.opt.Root, k.pgid, m)
	}
	if err != nil {
		if notOccupying(err) {
			return errNoOccupant
		}
		return unsureError{err}
	}
	as := -1
	if k.opt.CheckUID {
		as = k.opt.UID
	}
	err = signalWhilePinned(k.opt.Root, k.pgid, pin, sig, owned, as)
	switch {
	case held:
	case err == nil && pin.PID == k.pgid && k.leader == nil:
		// Verified in the group under the group's own number: its
		// struct pid is the group's.
		k.leader = pin
	default:
		pin.Close()
	}
	return err
}

// leaderOccupies re-verifies the held leader: alive, not a zombie, and
// still in the group.
func (k *killer) leaderOccupies() error {
	st, err := fingerprint.Revalidate(k.opt.Root, k.leader.Stat)
	if err != nil {
		return err
	}
	if st.PGID != k.pgid || st.Zombie() {
		return errNoOccupant
	}
	return nil
}

// releaseLeader gives up the leader's pidfd, unless m is the leader, and
// reports whether it did. The pidfd only spares proof in the search for
// joiners; a signal that needs the descriptor matters more.
func (k *killer) releaseLeader(m fingerprint.Stat) bool {
	if k.leader == nil || fingerprint.Same(k.leader.Stat, m) {
		return false
	}
	k.leader.Close()
	k.leader = nil
	return true
}

// unsureError means it could not be told whether a member occupies the
// group.
type unsureError struct{ err error }

func (e unsureError) Error() string { return e.err.Error() }
func (e unsureError) Unwrap() error { return e.err }

func outOfDescriptors(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

// leaderFirst returns members with the group's leader, if recorded, first.
func leaderFirst(pgid int, members []fingerprint.Stat) []fingerprint.Stat {
	for i, m := range members {
		if m.PID == pgid {
			if i == 0 {
				return members
			}
			out := make([]fingerprint.Stat, 0, len(members))
			out = append(out, m)
			out = append(out, members[:i]...)
			return append(out, members[i+1:]...)
		}
	}
	return members
}

// notOccupying reports whether err proves the recorded member no longer
// occupies the group: it is gone, its PID is another process's or a
// thread's, or it moved out of the group or exited.
func notOccupying(err error) bool {
	return errors.Is(err, errNoOccupant) || errors.Is(err, fingerprint.ErrNotFound) ||
		errors.Is(err, fingerprint.ErrRecycled) || errors.Is(err, fingerprint.ErrNotProcess)
}

// occupant pins m if it is alive, the recorded process, and still in pgid.
func occupant(root string, pgid int, m fingerprint.Stat) (*fingerprint.Pinned, error) {
	pin, err := fingerprint.Pin(root, m)
	if err != nil {
		return nil, err
	}
	if pin.PGID != pgid || pin.Zombie() {
		pin.Close()
		return nil, errNoOccupant
	}
	return pin, nil
}

// signalWhilePinned signals pgid while pin, stopped, proves the group is
// the recorded one and owned finds no process of another UID. The group is checked before the stop too: a member that
// has left the group must not get a stop and continue meant for another
// group. A member its owner had stopped (state T) is neither stopped again
// nor continued: the continue would undo the owner's stop.
func signalWhilePinned(root string, pgid int, pin *fingerprint.Pinned, sig syscall.Signal, owned func() error, as int) error {
	before, err := occupies(root, pgid, pin.Stat)
	if err != nil {
		return err
	}
	if err := owned(); err != nil {
		return err // not even stopped
	}
	if !stoppedState(before.State) {
		// As the tree's UID, like the group's signal: a member that
		// switched wholly to another UID since owned() looked (su,
		// sudo) is not stopped.
		if _, err := asUID(as, func() error { return pin.Signal(unix.SIGSTOP) }); err != nil {
			if errors.Is(err, fingerprint.ErrNotFound) {
				return errNoOccupant // it exited after being pinned
			}
			// EPERM and the like: the group is there but not ours to
			// signal. Reporting it gone would hide a tree that survives.
			return err
		}
		_ = waitStopped(root, pin.Stat) // not stopped (uninterruptible sleep): the check below is the best there is
		// Let the pinned member run again: it must receive SIGTERM, and
		// if we bail out it must be left as we found it. As root: this
		// only undoes our own stop, which a member that switched UIDs
		// since must not keep.
		defer pin.Signal(unix.SIGCONT) //nolint:errcheck // it may be dead by then
	}
	if _, err := occupies(root, pgid, pin.Stat); err != nil {
		return err
	}
	if err := owned(); err != nil {
		return err
	}
	if err := killpgAs(pgid, sig, as); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("killpg(%d, %v): %w", pgid, sig, err)
	}
	return nil
}

// killpgAs sends sig to group pgid. With uid > 0, and the caller root,
// it sends it as uid (asUID), so that the kernel itself refuses the
// signal to a process of the group whose real and saved UIDs are not
// uid's, whatever joined the group or took another UID since it was
// recorded.
func killpgAs(pgid int, sig syscall.Signal, uid int) error {
	_, err := signalAs(pgid, sig, uid)
	return err
}

// signalAs is killpgAs; it also returns the thread it signalled from (0
// when it signalled as root from the caller's).
func signalAs(pgid int, sig syscall.Signal, uid int) (tid int, err error) {
	return asUID(uid, func() error { return unix.Kill(-pgid, sig) })
}

// asUID runs send, a signal's sending, with uid's effective UID when uid
// > 0 and the caller is root: the kernel then refuses the signal to a
// process whose real and saved UIDs are not uid's, so one that switched
// wholly to another UID after it was checked (su, sudo) gets nothing. A
// setuid program run in between keeps its caller's real UID, which the
// kernel still takes. It returns the thread send ran on (0: the
// caller's, as root).
//
// send runs on a thread of its own: setresuid(2) through the raw system
// call changes the calling thread only (Go's Setresuid changes them
// all), and the thread stays locked while it is uid's. The effective UID
// is uid, which is what the kernel checks the signal by; the real UID is
// one no process has and the saved one root's, so that uid, whose
// processes these are, cannot signal that thread (a SIGSTOP to it stops
// the whole program), and the thread can take root's UIDs back. It does,
// and goes back to the runtime's pool: a thread that ended would fire
// PR_SET_PDEATHSIG on the children forked from it (a podman CLI, watch's
// `podman events`). One that cannot take them back stays locked and ends
// with its goroutine. The main thread, whose credentials /proc shows for
// the program, never takes uid's; nor does a thread that cannot (no
// CAP_SETUID, a user namespace that does not map it): the signal then
// goes out as root's, as before.
func asUID(uid int, send func() error) (tid int, err error) {
	if uid <= 0 || unix.Geteuid() != 0 {
		return 0, send()
	}
	noone := uint32(noUID)
	if uint32(uid) == noone {
		noone--
	}
	type sent struct {
		tid int
		err error
	}
	done := make(chan sent, 1)
	go func() {
		runtime.LockOSThread()
		tid := unix.Gettid()
		dropped := false
		if tid != unix.Getpid() {
			// On failure the thread is still root's, and sends as
			// root: as good as before, never worse.
			_, _, errno := unix.RawSyscall(sysSetresuid, uintptr(noone), uintptr(uid), 0)
			dropped = errno == 0
		}
		err := send()
		if dropped {
			if _, _, errno := unix.RawSyscall(sysSetresuid, 0, 0, 0); errno != 0 {
				done <- sent{tid, err}
				return // locked: the thread ends with the goroutine
			}
		}
		runtime.UnlockOSThread()
		done <- sent{tid, err}
	}()
	r := <-done
	return r.tid, r.err
}

// noUID is a UID no process runs as: (uid_t)-2, the last one that is not
// the "no change" -1.
const noUID uint32 = 1<<32 - 2

// occupies re-reads the pinned member and says whether it is still a live
// member of pgid.
func occupies(root string, pgid int, want fingerprint.Stat) (fingerprint.Stat, error) {
	st, err := fingerprint.Revalidate(root, want)
	if outOfDescriptors(err) {
		// A read that could not be made proves nothing about the member.
		return st, unsureError{err}
	}
	if err != nil || st.PGID != pgid || st.Zombie() {
		return st, errNoOccupant
	}
	return st, nil
}

// stoppedState reports whether a /proc state letter is a stop (by a
// signal, T, or by a tracer, t).
func stoppedState(s byte) bool { return s == 'T' || s == 't' }

// waitStopped polls briefly until the pinned process reports a stopped
// state. SIGSTOP is delivered asynchronously.
func waitStopped(root string, want fingerprint.Stat) bool {
	for i := 0; i < 50; i++ {
		st, err := fingerprint.ReadStat(root, want.PID)
		if err != nil {
			return false
		}
		if stoppedState(st.State) {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// waitDead reports whether every original member is dead, looking again
// whenever a pinned member exits and at least every opt.Poll, until ctx is
// done. kc-hook runs this in each container's stop path, where a fixed
// tick would add most of an interval to every stop.
func waitDead(ctx context.Context, opt Options, g Group) bool {
	w := newExitWatch(opt.Root)
	defer w.close()
	for {
		live := alive(opt.Root, g)
		if len(live) == 0 {
			return true
		}
		if expired(ctx) {
			return false
		}
		w.wait(ctx, live, opt.Poll)
	}
}

// expired reports whether ctx is done or its deadline has passed; the
// latter can be seen a moment before ctx's own timer marks it done.
func expired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// alive returns the original members that are still the recorded, living
// processes. A zombie counts as dead: it has exited and only waits for its
// parent.
func alive(root string, g Group) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range g.Members {
		st, err := fingerprint.Revalidate(root, m)
		switch {
		case err == nil && st.Zombie():
		case err == nil, !notOccupying(err):
			// Alive, or not provably dead: an unreadable member must not
			// let a kill report success.
			out = append(out, m)
		}
	}
	return out
}

func describe(ms []fingerprint.Stat) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d(%s)", m.PID, m.Comm)
	}
	return strings.Join(parts, ", ")
}
