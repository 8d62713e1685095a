package contain

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// SweepOptions configure Sweep.
type SweepOptions struct {
	// Root is the procfs mount; default /proc.
	Root string
	// UIDs are more UIDs than the cgroup's the tree runs as wholly (a
	// wrapper's command started through setpriv): its processes are
	// judged the tree's too.
	UIDs []int
	// FreezeWait bounds the wait for the cgroup to report frozen (default
	// 2s); a cgroup that does not freeze in time is swept anyway.
	FreezeWait time.Duration
	// KillWait bounds the wait for the killed to leave it (default 3s).
	KillWait time.Duration
	// Keep leaves the emptied cgroup in place (a supervisor about to be
	// restarted into it).
	Keep bool
	// BornBefore, when set, withholds every process that started after
	// it, or in its tick (in /proc's start ticks): a sweep decided on an earlier look at
	// the host spares what a restart of the container put in since.
	BornBefore uint64
	// Spare, when set, withholds the processes it names: members of
	// trees the sweep's decision left alone (a live container's group
	// holding a process of this one), which the cgroup's member rules
	// cannot tell from the rest.
	Spare func(fingerprint.Stat) bool
}

func (o SweepOptions) withDefaults() SweepOptions {
	if o.Root == "" {
		o.Root = fingerprint.DefaultRoot
	}
	if o.FreezeWait <= 0 {
		o.FreezeWait = 2 * time.Second
	}
	if o.KillWait <= 0 {
		o.KillWait = 3 * time.Second
	}
	return o
}

// SweepResult is what a sweep found and did.
type SweepResult struct {
	// Outcome: action.Reaped (something was killed and the cgroup is
	// empty), action.Gone (it was empty, or gone), action.WouldNotDie
	// (processes it signalled are left), or action.SkipForeign (refused:
	// the caller is inside it, or a path not to be trusted; or only
	// withheld processes are left in it).
	Outcome action.Action
	// Method is how they were killed: "cgroup.kill", "sigkill-frozen" or
	// "pidfd" (some were withheld).
	Method string
	Killed []fingerprint.Stat
	// Withheld were never signalled: another UID's (or setuid), another
	// container's, a container monitor, unreadable, started at or after
	// BornBefore, or spared (Spare).
	Withheld []fingerprint.Identity
	Frozen   bool
	Empty    bool
	Removed  bool
	Err      error
}

// Record sums r up for the ledger.
func (r SweepResult) Record(c *Cgroup) ledger.Cgroup {
	lc := c.Record()
	lc.Outcome, lc.Removed = r.Outcome, r.Removed
	for _, w := range r.Withheld {
		lc.Withheld = append(lc.Withheld, ledger.Process{PID: w.PID, StartTicks: w.StartTicks, Comm: w.Comm})
	}
	if r.Err != nil {
		lc.Error = r.Err.Error()
	}
	return lc
}

// busDialWait bounds the systemd connection a sweep makes.
const busDialWait = 5 * time.Second

// timeLeft is the time before ctx's deadline (an hour without one; none
// once it is done).
func timeLeft(ctx context.Context) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), 0)
	}
	return time.Hour
}

// Sweep reaps what is left in the cgroup (DESIGN "Descendants that leave
// the group"): freeze it, so nothing in it runs (a fork loop included);
// list its processes and apply the member rules to each (the tree's UID,
// no other container's ID, no container monitor); if every one passes and
// the freeze took, cgroup.kill (or SIGKILL to each while frozen, on
// kernels without it), else SIGKILL the allowed ones through their pidfds
// and report the rest; thaw; wait for it to empty; remove it (stop the
// scope, for systemd, once no child cgroup holds a process).
func Sweep(ctx context.Context, c *Cgroup, opt SweepOptions) SweepResult {
	opt = opt.withDefaults()
	res := SweepResult{Outcome: action.Gone}
	if c.Path == "" {
		// A scope that was never started (Enter failed): there is no
		// cgroup of this tree's to sweep, and its unit name may be
		// another's.
		res.Outcome, res.Err = action.SkipForeign, fmt.Errorf("%s was never entered: not swept", c)
		return res
	}
	if c.selfInside() {
		res.Outcome, res.Err = action.SkipForeign, fmt.Errorf("%s holds the caller itself: not swept", c)
		return res
	}
	mfd, err := openMount(c.Mount, c.Kind)
	if err != nil {
		res.Outcome, res.Err = action.WouldNotDie, err
		return res
	}
	defer unix.Close(mfd)
	fd, err := openPath(mfd, c.Path, c.Kind)
	if errors.Is(err, unix.ENOENT) {
		// Nothing of the tree's is left to stop: systemd collects a scope
		// once empty, and a unit of this name now is a restarted
		// container's new one, whose supervisor stopping it would kill.
		res.Empty, res.Removed = true, true
		return res
	}
	if err != nil {
		res.Outcome, res.Err = action.SkipForeign, fmt.Errorf("%s refused: %w", c, err)
		return res
	}
	defer unix.Close(fd)
	var scoper Scoper
	if c.Kind == KindSystemd && !opt.Keep {
		// Connected before anything is killed: the stop then follows the
		// emptying at once, not after a connection's setup, during which
		// a restart of the container could start a scope of this name.
		// A bus slow to answer costs a share of the time, not all of it
		// before anything is killed.
		dctx, cancel := context.WithTimeout(ctx, min(busDialWait, timeLeft(ctx)/4))
		s, done, err := c.bus(dctx)
		cancel()
		if err != nil {
			c.opt.Logger.Warn("no systemd connection; the scope is swept but not stopped", "unit", c.Unit, "err", err)
		} else {
			defer done()
			scoper = s
		}
	}

	pids, err := procs(fd)
	if err != nil {
		res.Outcome, res.Err = action.WouldNotDie, err
		return res
	}
	// Tasks still exiting (the tree's, killed a moment ago) are listed
	// until they are gone, and a freeze would wait for them: with none
	// running, there is nothing to freeze or kill, only to wait for.
	if slices.ContainsFunc(pids, func(pid int) bool { return fingerprint.Running(opt.Root, pid) }) {
		// The freeze and its thaw must both happen before the caller's
		// time is up (kc-hook's poststop exits at its deadline with this
		// still running): a cgroup left frozen holds what the sweep
		// spares, and nothing thaws it later. Without the time, the
		// judged processes are killed through their pidfds, unfrozen.
		if wait := min(opt.FreezeWait, timeLeft(ctx)/2); wait > 0 {
			res.Frozen = c.freeze(fd, wait)
		}
		c.kill(fd, opt, &res)
		if err := c.thaw(fd); err != nil {
			res.Err = errors.Join(res.Err, err)
		}
	}
	res.Empty = c.waitEmpty(ctx, fd, opt.KillWait, res.Withheld)
	switch {
	case !res.Empty:
		left, _ := procs(fd)
		res.Outcome = action.WouldNotDie
		if onlyWithheld(left, res.Withheld) {
			// What is left was never ours to kill: reported, not failed.
			res.Outcome = action.SkipForeign
			return res
		}
		res.Err = errors.Join(res.Err, fmt.Errorf("%s still holds %d processes", c, len(left)))
		return res
	case len(res.Killed) > 0:
		res.Outcome = action.Reaped
	}
	if opt.Keep {
		return res
	}
	if c.Kind == KindSystemd {
		// Stopping the scope has systemd kill its whole subtree: child
		// cgroups' processes (a delegated scope's), which procs never
		// listed and no rule judged. Only a scope with none left is
		// stopped.
		if !eventIs(fd, "populated", "0") {
			res.Err = errors.Join(res.Err, fmt.Errorf("%s: its child cgroups still hold processes no rule judged: scope not stopped", c))
			return res
		}
		res.Err = errors.Join(res.Err, c.stopScope(ctx, scoper, mfd, fd))
		res.Removed = c.gone(mfd)
		return res
	}
	pfd, err := openPath(mfd, Dir, c.Kind)
	if err != nil {
		res.Err = errors.Join(res.Err, err)
		return res
	}
	defer unix.Close(pfd)
	err = unix.Unlinkat(pfd, c.containerID, unix.AT_REMOVEDIR)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		res.Removed = true
	default:
		res.Err = errors.Join(res.Err, fmt.Errorf("removing %s: %w", c, err))
	}
	return res
}

// procs lists the cgroup's processes.
func procs(fd int) ([]int, error) {
	data, err := readAt(fd, "cgroup.procs")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !slices.Contains(out, pid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

// freeze freezes the cgroup and waits, at most limit, until it says so.
func (c *Cgroup) freeze(fd int, limit time.Duration) bool {
	var err error
	if c.Kind == KindFreezer {
		err = writeAt(fd, "freezer.state", "FROZEN")
	} else {
		err = writeAt(fd, "cgroup.freeze", "1")
	}
	if err != nil {
		c.opt.Logger.Warn("cannot freeze the cgroup; sweeping it running", "cgroup", c.String(), "err", err)
		return false
	}
	return poll(limit, func() bool {
		if c.Kind == KindFreezer {
			data, err := readAt(fd, "freezer.state")
			return err == nil && strings.TrimSpace(string(data)) == "FROZEN"
		}
		return eventIs(fd, "frozen", "1")
	})
}

func (c *Cgroup) thaw(fd int) error {
	if c.Kind == KindFreezer {
		return writeAt(fd, "freezer.state", "THAWED")
	}
	err := writeAt(fd, "cgroup.freeze", "0")
	if errors.Is(err, unix.ENOENT) {
		return nil // never frozen: no cgroup.freeze here
	}
	return err
}

// kill applies the member rules to every process in the cgroup and kills
// those that pass, all at once when all do.
func (c *Cgroup) kill(fd int, opt SweepOptions, res *SweepResult) {
	rules := trees.Rules{UID: c.UID, AlsoUIDs: opt.UIDs, ContainerID: c.containerID}
	// A process not frozen could still fork: list again until a round
	// finds nothing new to kill (bounded; a frozen cgroup needs one).
	for round := 0; round < 8; round++ {
		pids, err := procs(fd)
		if err != nil {
			res.Err = errors.Join(res.Err, err)
			return
		}
		var allowed []fingerprint.Stat
		withheld := res.Withheld[:0:0]
		judged := map[int]uint64{}
		for _, pid := range pids {
			id, err := fingerprint.Read(opt.Root, pid)
			switch {
			case err != nil && errors.Is(err, fingerprint.ErrNotFound):
				continue
			case err != nil:
				withheld = append(withheld, fingerprint.Identity{Stat: fingerprint.Stat{PID: pid}, UID: -1, EUID: -1, SUID: -1})
			case id.Zombie():
				judged[pid] = id.StartTicks
			case pid == os.Getpid() || pid <= 1 || !rules.Member(id),
				opt.BornBefore > 0 && id.StartTicks >= opt.BornBefore, // same tick: the doubt spares
				opt.Spare != nil && opt.Spare(id.Stat):
				withheld = append(withheld, id)
			default:
				allowed = append(allowed, id.Stat)
				judged[pid] = id.StartTicks
			}
		}
		res.Withheld = withheld
		// Each PID was listed before its process was read: one that
		// exited in between, its PID taken by a process outside the
		// cgroup, was judged in its place. A PID listed again now names
		// the process read (the pin checks the start time read), so only
		// processes in the cgroup after they were judged are killed.
		now, err := procs(fd)
		if err != nil {
			res.Err = errors.Join(res.Err, err)
			return
		}
		listed := make(map[int]bool, len(now))
		for _, pid := range now {
			listed[pid] = true
		}
		allowed = slices.DeleteFunc(allowed, func(s fingerprint.Stat) bool { return !listed[s.PID] })
		maps.DeleteFunc(judged, func(pid int, _ uint64) bool { return !listed[pid] })
		if len(allowed) == 0 {
			return
		}
		res.Killed = mergeStats(res.Killed, allowed)
		// Unfrozen, a process judged could fork or exec between the
		// judging and cgroup.kill, which would take what no rule judged:
		// then each judged one is killed through its pidfd. Frozen or
		// not, a process can be started into the cgroup from outside
		// (a restarted container's wrapper reuses it, CLONE_INTO_CGROUP)
		// after the last look: a decision that spares what was born
		// after it (BornBefore) kills the judged ones only.
		if len(withheld) == 0 && res.Frozen && c.Kind != KindFreezer && opt.BornBefore == 0 && c.killAll(fd, opt.Root, judged) {
			res.Method = "cgroup.kill"
			return
		}
		res.Method = "pidfd"
		if len(withheld) == 0 && res.Frozen {
			res.Method = "sigkill-frozen"
		}
		if _, err := pgkill.SignalEach(opt.Root, allowed, append([]int{c.UID}, opt.UIDs...), unix.SIGKILL); err != nil {
			res.Err = errors.Join(res.Err, err)
		}
		if res.Frozen {
			return // nothing in it could fork meanwhile
		}
	}
}

// killAll writes cgroup.kill once the cgroup holds exactly the processes
// judged (PID: start ticks), each still the one judged: one moved in
// since, or a PID that names another process since, is judged first.
func (c *Cgroup) killAll(fd int, root string, judged map[int]uint64) bool {
	// cgroup.kill takes the child cgroups too, whose processes procs
	// does not list and no rule judged (a delegated scope's, a nested
	// runtime's): those are left to the pidfds of the judged ones.
	if !eventIsIn(fd, "cgroup.stat", "nr_descendants", "0") {
		return false
	}
	now, err := procs(fd)
	if err != nil || !stillJudged(root, now, judged) {
		return false
	}
	err = writeAt(fd, "cgroup.kill", "1")
	if err != nil && !errors.Is(err, unix.ENOENT) {
		c.opt.Logger.Warn("cgroup.kill failed; killing each process", "cgroup", c.String(), "err", err)
	}
	return err == nil
}

// stillJudged reports whether now are exactly the processes judged, each
// with the start it was judged with: a PID recycled since names a
// process no rule judged.
func stillJudged(root string, now []int, judged map[int]uint64) bool {
	if len(now) != len(judged) {
		return false
	}
	for _, p := range now {
		start, ok := judged[p]
		if !ok {
			return false
		}
		if st, err := fingerprint.ReadStat(root, p); err != nil || st.StartTicks != start {
			return false
		}
	}
	return true
}

// waitEmpty waits, at most limit, for the cgroup to hold no process, and
// reports whether it does. Once only withheld processes are left, there
// is nothing more to wait for.
func (c *Cgroup) waitEmpty(ctx context.Context, fd int, limit time.Duration, withheld []fingerprint.Identity) bool {
	empty := false
	poll(limit, func() bool {
		if ctx.Err() != nil {
			return true
		}
		if c.Kind != KindFreezer && eventIs(fd, "populated", "0") {
			empty = true
			return true
		}
		p, err := procs(fd)
		empty = err == nil && len(p) == 0
		return empty || onlyWithheld(p, withheld)
	})
	return empty
}

// stopScope stops the scope swept through fd with s, by its unit's name:
// only while that name's cgroup is still the directory swept (a scope
// collected since and started again by a restarted container is
// another, whose supervisor systemd would kill).
func (c *Cgroup) stopScope(ctx context.Context, s Scoper, mfd, fd int) error {
	if c.Kind != KindSystemd || s == nil {
		return nil
	}
	var swept, now unix.Stat_t
	if unix.Fstat(fd, &swept) != nil || unix.Fstatat(mfd, c.Path, &now, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		swept.Dev != now.Dev || swept.Ino != now.Ino {
		return nil
	}
	if err := s.StopScope(ctx, c.Unit); err != nil {
		return fmt.Errorf("stopping %s: %w", c.Unit, err)
	}
	return nil
}

// gone reports whether the cgroup's directory is no more.
func (c *Cgroup) gone(mfd int) bool {
	return poll(time.Second, func() bool {
		var st unix.Stat_t
		return errors.Is(unix.Fstatat(mfd, c.Path, &st, unix.AT_SYMLINK_NOFOLLOW), unix.ENOENT)
	})
}

// eventIs reports whether cgroup.events has key set to value.
func eventIs(fd int, key, value string) bool {
	return eventIsIn(fd, "cgroup.events", key, value)
}

// eventIsIn reports whether the flat-keyed file name has key at value.
func eventIsIn(fd int, name, key, value string) bool {
	data, err := readAt(fd, name)
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			return v == value
		}
	}
	return false
}

// poll checks cond until it holds or limit passes.
func poll(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
	}
}

func onlyWithheld(left []int, withheld []fingerprint.Identity) bool {
	for _, p := range left {
		if !slices.ContainsFunc(withheld, func(w fingerprint.Identity) bool { return w.PID == p }) {
			return false
		}
	}
	return len(left) > 0
}

func mergeStats(have, add []fingerprint.Stat) []fingerprint.Stat {
	for _, s := range add {
		if !slices.ContainsFunc(have, func(h fingerprint.Stat) bool { return fingerprint.Same(h, s) }) {
			have = append(have, s)
		}
	}
	return have
}
