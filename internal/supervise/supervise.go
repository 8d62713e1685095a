package supervise

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// Errors Run returns.
var (
	// ErrInitGone: the container's init process was already gone when the
	// wrapper started; the command was never run.
	ErrInitGone = errors.New("container init process is gone")
	// ErrGaveUp: the command kept exiting and the restart budget is spent.
	ErrGaveUp = errors.New("command kept exiting; restart budget spent")
	// ErrWouldNotDie: members of the group survived SIGKILL.
	ErrWouldNotDie = errors.New("group members survived SIGKILL")
)

// SnapshotSource is the ledger Tree.Source of the wrapper's snapshots.
const SnapshotSource = "supervise"

// Options configure Run. Spec is required; the rest have defaults.
type Options struct {
	Spec
	// Env is the command's environment; nil inherits the wrapper's.
	Env []string
	// Dir is the command's working directory; default "/".
	Dir string
	// Stdout and Stderr are the command's; default the wrapper's own.
	Stdout, Stderr *os.File
	// OutputCap bounds a regular file Stdout or Stderr is (0:
	// DefaultOutputCap; negative: no bound): the command writes through
	// the wrapper, which empties the file before it would grow past it.
	OutputCap int64
	// Root is the procfs mount; default /proc.
	Root string
	// Store receives snapshots of the group; nil records nothing.
	Store *ledger.Store
	// KillGrace is the wait between SIGTERM and SIGKILL; default 5s.
	KillGrace time.Duration
	// KillWait bounds the wait after SIGKILL; default 3s.
	KillWait time.Duration
	// MaxRestarts bounds restarts of a command that exits (0: never).
	MaxRestarts int
	// RestartDelay is the first backoff (default 1s); it doubles per
	// restart up to MaxRestartDelay (default 1m).
	RestartDelay    time.Duration
	MaxRestartDelay time.Duration
	// StableAfter: a command that ran at least this long before exiting
	// gets its restart budget back (default 10m).
	StableAfter time.Duration
	// PdeathSig is sent to the command if the wrapper dies; default TERM.
	PdeathSig syscall.Signal
	// InitPoll is the interval of the identity polling used when pidfds
	// are not available (or ForcePoll is set); default 250ms.
	InitPoll  time.Duration
	ForcePoll bool
	// Poll is the interval of liveness checks while tearing down; default
	// 20ms.
	Poll time.Duration
	// Refresh is how often the ledger snapshot is refreshed once the
	// command has run a while (default 10s; the first refreshes come
	// sooner). It is written only when the membership changed.
	Refresh time.Duration
	// NoContain starts the command without a cgroup of its own; Contain
	// says how to find and make one (DESIGN "Descendants that leave the
	// group").
	NoContain bool
	Contain   contain.Options
	Logger    *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Dir == "" {
		o.Dir = "/"
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Root == "" {
		o.Root = fingerprint.DefaultRoot
	}
	if o.KillGrace <= 0 {
		o.KillGrace = 5 * time.Second
	}
	if o.KillWait <= 0 {
		o.KillWait = 3 * time.Second
	}
	if o.MaxRestarts < 0 {
		o.MaxRestarts = 0
	}
	if o.RestartDelay <= 0 {
		o.RestartDelay = DefaultRestartDelay
	}
	if o.MaxRestartDelay <= 0 {
		o.MaxRestartDelay = time.Minute
	}
	if o.StableAfter <= 0 {
		o.StableAfter = 10 * time.Minute
	}
	if o.PdeathSig == 0 {
		o.PdeathSig = DefaultPdeathSig
	}
	if o.InitPoll <= 0 {
		o.InitPoll = 250 * time.Millisecond
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Millisecond
	}
	if o.Refresh <= 0 {
		o.Refresh = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	}
	return o
}

// Backoff returns the delay before restart number n (0-based).
func Backoff(first, max time.Duration, n int) time.Duration {
	d := first
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Run is the wrapper: it makes sure the calling process leads its own
// process group, starts the command as its child (with PdeathSig), and
// returns once the container's init process has died or ctx is cancelled
// (the caller cancels it on SIGTERM), after taking down every other
// process of its group (SIGTERM, grace, SIGKILL). A command that exits is
// restarted at most MaxRestarts times, with exponential backoff.
//
// Run takes its group down with pgkill.KillOthers, member by member
// through pidfds and never with killpg: the wrapper itself is in the
// group and must outlive it.
func Run(ctx context.Context, o Options) error {
	o = o.withDefaults()
	if len(o.Command) == 0 {
		return errors.New("no command")
	}
	r := &runner{o: o, log: o.Logger, snaps: map[int]string{}}
	if err := r.lead(); err != nil {
		return err
	}
	if o.OutputCap >= 0 {
		max := cmp.Or(o.OutputCap, DefaultOutputCap)
		// One file (kc-hook's launch gives both the log) gets one pipe:
		// its lines keep their order, and one writer empties it.
		targets := []**os.File{&r.o.Stdout, &r.o.Stderr}
		if sameFile(r.o.Stdout, r.o.Stderr) {
			targets = targets[:1]
		}
		for _, f := range targets {
			w, stop, err := capOutput(*f, max)
			if err != nil {
				r.log.Warn("command output not bounded", "err", err)
				continue
			}
			if len(targets) == 1 {
				r.o.Stderr = w
			}
			*f = w
			defer stop()
		}
	}
	// A daemon the supervisor's kernels double-fork is orphaned before
	// anything could see its parent: as the subreaper, the wrapper gets
	// it instead of PID 1, and it stays below the wrapper, where the
	// teardown's walk finds it (DESIGN "Descendants that leave the group").
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		r.log.Warn("not a child subreaper: a daemon of the tree escapes it", "err", err)
	} else {
		r.subreaper = true
	}
	if !o.NoContain {
		r.prepareCgroup()
		defer r.cg.Close()
	}

	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	initDead, how, err := watchInit(wctx, o.Root, o.Init, o.ForcePoll, o.InitPoll)
	if err != nil {
		r.log.Warn("container init is gone; not starting the command", "init_pid", o.Init.PID, "err", err)
		return err
	}
	r.log.Info("watching container init", "init_pid", o.Init.PID, "init_start_ticks", o.Init.StartTicks, "method", how)
	r.matchOOMScore()

	restarts := 0
	for {
		var ran time.Duration
		c, err := r.startChild()
		if err != nil {
			r.log.Error("command did not start", "argv0", o.Command[0], "err", err)
			if r.givesUp(restarts, ran) {
				r.sweep(false) // the cgroup made for it
			}
		} else {
			r.child = c
			r.log.Info("command started", "pid", c.pid, "argv0", o.Command[0], "restart", restarts)
			r.refresh()
			switch reason := r.wait(ctx, initDead); reason {
			case "init exited", "stop signal":
				return r.shutdown(reason)
			}
			ran = time.Since(c.started)
			// Whatever the command left in the group goes before the next
			// start, while its unreaped zombie still pins its own group.
			// The cgroup is kept for that start, and removed when none
			// follows.
			left := r.stopGroup()
			r.sweep(!r.givesUp(restarts, ran))
			st := c.reap()
			r.child = nil
			r.log.Warn("command exited", "pid", c.pid, "status", st.String(), "ran", ran.Round(time.Millisecond).String(), "left_alive", len(left))
		}
		if r.givesUp(restarts, ran) {
			r.log.Error("giving up: the command keeps exiting", "restarts", restarts, "max_restarts", o.MaxRestarts)
			r.recordOutcome(action.Gone, "")
			return ErrGaveUp
		}
		if ran >= o.StableAfter {
			restarts = 0
		}
		delay := Backoff(o.RestartDelay, o.MaxRestartDelay, restarts)
		restarts++
		r.log.Info("restarting the command", "in", delay.String(), "restart", restarts, "max_restarts", o.MaxRestarts)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-initDead:
			t.Stop()
			return r.shutdown("init exited")
		case <-ctx.Done():
			t.Stop()
			return r.shutdown("stop signal")
		}
	}
}

// givesUp: no restart follows a run of ran after restarts restarts (a
// stable run starts the count afresh).
func (r *runner) givesUp(restarts int, ran time.Duration) bool {
	if ran >= r.o.StableAfter {
		restarts = 0
	}
	return restarts >= r.o.MaxRestarts
}

type runner struct {
	o    Options
	log  *slog.Logger
	self fingerprint.Stat
	// uids are the UIDs the tree runs as (treeUIDs), as stopGroup found
	// them.
	uids  []int
	child *child
	// snaps remembers the membership last written per group, so the
	// ledger is written only when it changes.
	snaps map[int]string
	// subreaper: orphaned descendants are reparented to the wrapper,
	// which must reap them (reapAdopted).
	subreaper bool
	// oom: the command's oom_score_adj when it is not the wrapper's.
	oom *oomScores
	// cg is the command's cgroup; nil when it is not contained. cloned:
	// the command was started inside it (cgroup v2, CLONE_INTO_CGROUP),
	// so that everything it forks is in it unless moved out.
	cg         *contain.Cgroup
	cgRecorded bool
	cloned     bool
}

// lead makes the wrapper the leader of its own process group. kc-hook
// starts it with setsid; by hand it may be a shell's job, which already
// leads its group, or a plain child, which must leave its parent's group
// before it may signal "its" group.
func (r *runner) lead() error {
	pid := os.Getpid()
	if pgid, err := unix.Getpgid(0); err != nil || pgid != pid {
		if _, err := unix.Setsid(); err != nil {
			return fmt.Errorf("becoming a session leader: %w", err)
		}
	} else if sid, err := unix.Getsid(0); err != nil || sid != pid {
		// A shell's job: the group is the job's, and the rest of a
		// pipeline (kc-hook supervise … | tee log) would be taken down
		// and recorded as the tree's.
		for _, m := range pgkill.Members(r.o.Root, pid) {
			if m.PID != pid {
				return fmt.Errorf("process group %d also holds %s (%d), which would be taken down with the tree: start the wrapper alone (setsid kc-hook supervise …)", pid, m.Comm, m.PID)
			}
		}
	}
	st, err := fingerprint.ReadStat(r.o.Root, pid)
	if err != nil {
		return fmt.Errorf("reading own identity: %w", err)
	}
	if st.PGID != pid {
		return fmt.Errorf("process group %d is not led by the wrapper (%d)", st.PGID, pid)
	}
	r.self = st
	return nil
}

// wait returns why the child's run ended: "exited", "init exited" or
// "stop signal". It refreshes the ledger snapshot meanwhile: often at
// first, while the supervisor starts its first kernels, then every
// Refresh.
func (r *runner) wait(ctx context.Context, initDead <-chan struct{}) string {
	every := min(250*time.Millisecond, r.o.Refresh)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-r.child.exited:
			return "exited"
		case <-initDead:
			return "init exited"
		case <-ctx.Done():
			return "stop signal"
		case <-t.C:
			r.reapAdopted()
			r.refresh()
			every = min(2*every, r.o.Refresh)
			t.Reset(every)
		}
	}
}

// shutdown takes the group down and records the outcome.
func (r *runner) shutdown(reason string) error {
	r.log.Info("taking the group down", "reason", reason)
	left := r.stopGroup()
	r.sweep(false)
	if r.child != nil {
		select {
		case <-r.child.exited:
			st := r.child.reap()
			r.log.Info("command ended", "pid", r.child.pid, "status", st.String())
		case <-time.After(r.o.KillWait):
			r.log.Error("command survived SIGKILL", "pid", r.child.pid)
		}
	}
	if len(left) > 0 {
		msg := describe(left)
		r.log.Error("group members would not die", "members", msg)
		r.recordOutcome(action.WouldNotDie, msg)
		return fmt.Errorf("%w: %s", ErrWouldNotDie, msg)
	}
	r.log.Info("group down", "reason", reason)
	r.recordOutcome(action.Reaped, "")
	return nil
}

// groups are the process groups the wrapper answers for: its own, and the
// command's when the command left it to lead one of its own (a supervisor
// that calls setsid itself). The latter is safe to name only while the
// command is unreaped: its zombie keeps the group ID from being reused. A
// group the command joined but does not lead is another's (a wrapper
// started by hand stays in its shell's session, whose groups the command
// may join), and is not the wrapper's to take down.
func (r *runner) groups() []int {
	gs := []int{r.self.PGID}
	if r.child != nil && !r.child.reaped {
		if st, err := fingerprint.ReadStat(r.o.Root, r.child.pid); err == nil && st.PGID == r.child.pid && st.PGID != r.self.PGID {
			gs = append(gs, st.PGID)
		}
	}
	return gs
}

// stopGroup takes down every other member of the groups through pgkill
// (SIGTERM, grace, SIGKILL, members that appear meanwhile included) and
// returns the members still alive, those withheld (memberJudge) among
// them. The command is not reaped here.
func (r *runner) stopGroup() []fingerprint.Stat {
	popt := pgkill.Options{Root: r.o.Root, Grace: r.o.KillGrace, KillWait: r.o.KillWait, Poll: r.o.Poll}
	list := func(groups []int) []fingerprint.Stat { return pgkill.Members(r.o.Root, groups...) }
	confirm := list
	if r.subreaper && r.self.SID == r.self.PID {
		list = r.membersBelow
		if r.cloned {
			confirm = r.membersInCgroup
		}
	}
	uids := r.treeUIDs()
	r.uids = uids // for the cgroup's sweep, once the command is reaped
	if len(uids) == 0 {
		// Unjudged members are not signalled: listing none, KillOthers
		// sends nothing.
		r.log.Warn("cannot read the wrapper's own identity; the group's members are not signalled")
	}
	judge := newMemberJudge(r.o.Root, uids, r.o.ContainerID, r.log)
	popt.Members, popt.Confirm = judge.filter(list), judge.filter(confirm)
	popt.MemberUIDs = append(uids, -1) // never empty: empty would check nothing
	groups := r.groups()
	// Escaped descendants share the group's grace: found before the
	// group dies (a setsid child still has its parent then), killed
	// alongside it.
	var left []fingerprint.Stat
	escDone := make(chan []fingerprint.Stat, 1)
	go func() { escDone <- r.stopEscaped(groups, popt) }()
	res := pgkill.KillOthers(groups, popt)
	left = append(left, <-escDone...)
	if len(res.Outlived) > 0 {
		r.log.Warn("members outlived the grace; sent SIGKILL", "members", describe(res.Outlived))
	}
	if res.Refused > 0 {
		r.log.Debug("signals not sent: members gone, recycled or out of the group before they could be signalled", "count", res.Refused)
	}
	// What the dying group orphaned came to the wrapper (subreaper):
	// one more look below it.
	left = append(left, r.stopEscaped(groups, popt)...)
	r.reapAdopted()
	return append(append(res.Left, left...), judge.left()...)
}

// treeUIDs are the UIDs the wrapper's tree runs as: the wrapper's, and
// its command's while it is unreaped (its PID is its own until then) and
// runs wholly as one (an allowlist entry may start it through setpriv).
func (r *runner) treeUIDs() []int {
	ids, err := fingerprint.ReadUIDs(r.o.Root, os.Getpid())
	if err != nil || fingerprint.SoleUID(ids) < 0 {
		return nil
	}
	uids := []int{ids[0]}
	if r.child != nil && !r.child.reaped {
		if cids, err := fingerprint.ReadUIDs(r.o.Root, r.child.pid); err == nil {
			if u := fingerprint.SoleUID(cids); u >= 0 && u != ids[0] {
				uids = append(uids, u)
			}
		}
	}
	return uids
}

// maxBelow bounds membersBelow's walk; a bigger tree is listed through
// /proc.
const maxBelow = 1 << 16

// membersBelow lists the live members of groups among the wrapper's
// descendants, for pgkill.KillOthers's looks in place of a /proc
// listing, whose getpgid per process on the host, done by a hundred
// wrappers at once when a node drains, starved the host for seconds.
// When the wrapper (stopGroup checks) leads its session and is a
// subreaper, every member is below it: only the session's processes can
// join its groups, all were forked below the wrapper, and an orphan is
// reparented to the wrapper, not to PID 1. The walk can still miss one
// (being reparented as it passes, or where the kernel has no children
// files): KillOthers checks a look that finds none against the cgroup
// the command was started in (membersInCgroup), else /proc, so that no
// look but that last one reads more than the tree.
func (r *runner) membersBelow(groups []int) []fingerprint.Stat {
	self := os.Getpid()
	seen := map[int]bool{self: true}
	queue := []int{self}
	var out []fingerprint.Stat
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range trees.Children(r.o.Root, pid) {
			if seen[c] {
				continue
			}
			if len(seen) >= maxBelow {
				return pgkill.Members(r.o.Root, groups...)
			}
			seen[c] = true
			queue = append(queue, c)
			st, err := fingerprint.ReadStat(r.o.Root, c)
			if err != nil || st.Zombie() || !slices.Contains(groups, st.PGID) {
				continue
			}
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b fingerprint.Stat) int { return a.PID - b.PID })
	return out
}

// membersInCgroup lists the live members of groups in the command's
// cgroup, to confirm that the walk below the wrapper missed none: with
// the command started inside (r.cloned), a member the walk could miss
// (one being reparented as it passed) is there, and reading it costs the
// tree, not the host. A member that moved itself out of the cgroup and
// was missed by that last walk too is left to the janitor's scans. The
// cgroup unreadable, /proc is listed.
func (r *runner) membersInCgroup(groups []int) []fingerprint.Stat {
	pids, err := r.cg.Procs()
	if err != nil {
		return pgkill.Members(r.o.Root, groups...)
	}
	var out []fingerprint.Stat
	for _, pid := range pids {
		st, err := fingerprint.ReadStat(r.o.Root, pid)
		if err != nil || st.Zombie() || !slices.Contains(groups, st.PGID) {
			continue
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b fingerprint.Stat) int { return a.PID - b.PID })
	return out
}

// maxEscapedRounds bounds the walks for escaped descendants of a
// teardown: a tree that keeps forking new sessions is reported.
const maxEscapedRounds = 3

// stopEscaped kills the wrapper's descendants outside groups (the tree's
// setsid children and, the wrapper being a subreaper, its daemons)
// through pidfds, under the member rules (DESIGN "Descendants that leave the group"): the wrapper's UID
// only, no other container's ID, not below a container monitor. It
// returns those still alive.
func (r *runner) stopEscaped(groups []int, popt pgkill.Options) []fingerprint.Stat {
	self, err := fingerprint.Read(r.o.Root, os.Getpid())
	if err != nil {
		r.log.Warn("cannot read the wrapper's own identity; escaped descendants are not looked for", "err", err)
		return nil
	}
	rules := trees.Rules{InGroup: func(pgid int) bool { return slices.Contains(groups, pgid) }, UID: self.UID, AlsoUIDs: r.uids, ContainerID: r.o.ContainerID}
	var left []fingerprint.Stat
	for round := 0; round < maxEscapedRounds; round++ {
		esc, withheld := trees.Descendants(r.o.Root, nil, []fingerprint.Identity{self}, rules)
		for _, w := range withheld {
			r.log.Warn("descendant not signalled: another UID's (or setuid) or another container's", "pid", w.PID, "comm", w.Comm, "uid", w.UID, "euid", w.EUID, "suid", w.SUID)
		}
		if len(esc) == 0 {
			return nil
		}
		stats := make([]fingerprint.Stat, len(esc))
		for i, e := range esc {
			stats[i] = e.Stat
		}
		res := pgkill.KillEscaped(context.Background(), stats, self.UID, popt)
		r.log.Info("escaped descendants", "members", describe(stats), "action", res.Outcome, "err", res.Err)
		left = nil
		for _, s := range stats {
			if fingerprint.Alive(r.o.Root, s) {
				left = append(left, s)
			}
		}
		r.reapAdopted()
	}
	return left
}

// reapAdopted reaps the wrapper's exited children other than the
// command: orphans the subreaper adopted. Each is waited for by PID, so
// the command's own wait (waitid on its PID) is never raced.
func (r *runner) reapAdopted() {
	if !r.subreaper {
		return
	}
	for _, pid := range trees.Children(r.o.Root, os.Getpid()) {
		if r.child != nil && pid == r.child.pid {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

func describe(ms []fingerprint.Stat) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = strconv.Itoa(m.PID) + "(" + m.Comm + ")"
	}
	return strings.Join(parts, ", ")
}

// child is the running command. Its exit is observed with
// waitid(WNOWAIT), which leaves it a zombie until reap: until then its PID
// and process group cannot be reused.
type child struct {
	cmd     *exec.Cmd
	pid     int
	started time.Time
	exited  chan struct{}
	release chan struct{}
	reaped  bool
	state   *os.ProcessState
}

// startChild starts the command, in its cgroup when it has one. A
// command that cannot be started inside is started without it: a hook
// never keeps a supervisor from running, and the subreaper remains.
func (r *runner) startChild() (*child, error) {
	fd, into := r.cg.CloneFD()
	r.cloned = false
	c, err := r.startCommand(fd, into)
	if err != nil && into {
		r.log.Warn("command not started in its cgroup; starting it uncontained", "cgroup", r.cg.String(), "err", err)
		r.cg.Close()
		r.cg = nil
		c, err = r.startCommand(-1, false)
	}
	if err != nil {
		return nil, err
	}
	r.cloned = into && r.cg != nil
	if r.cg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.cg.Enter(ctx, c.pid)
		cancel()
		if err != nil {
			// Never swept then: a scope that could not be started for
			// it may be another wrapper's of the same name, and what a
			// cgroup it never entered holds is not its tree.
			r.log.Warn("command not moved into its cgroup; it runs uncontained", "cgroup", r.cg.String(), "err", err)
			r.cg.Close()
			r.cg = nil
		} else if !r.cgRecorded {
			r.log.Info("command contained", "cgroup", r.cg.String(), "kind", r.cg.Kind)
			r.recordCgroup(r.cg.Record())
			r.cgRecorded = true
		}
	}
	return c, nil
}

func (r *runner) startCommand(cgroupFD int, into bool) (*child, error) {
	cmd := exec.Command(r.o.Command[0], r.o.Command[1:]...)
	cmd.Env = r.o.Env
	cmd.Dir = r.o.Dir
	cmd.Stdout = r.o.Stdout
	cmd.Stderr = r.o.Stderr
	// Started straight into the cgroup (clone3 CLONE_INTO_CGROUP): no
	// moment passes with the command outside it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: r.o.PdeathSig, UseCgroupFD: into, CgroupFD: cgroupFD}
	c := &child{cmd: cmd, exited: make(chan struct{}), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		// The kernel sends the parent-death signal when the *thread*
		// that forked the child exits, not the process: keep this
		// thread, locked and alive, until the child has been reaped.
		runtime.LockOSThread()
		if err := r.withOOMScore(cmd.Start); err != nil {
			errc <- err
			return // exits the locked thread; there is no child
		}
		errc <- nil
		<-c.release
		runtime.UnlockOSThread()
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	c.pid = cmd.Process.Pid
	c.started = time.Now()
	go func() {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, c.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		close(c.exited)
	}()
	return c, nil
}

// reap collects the exited child. It must only be called once exited is
// closed.
func (c *child) reap() *os.ProcessState {
	if c.reaped {
		return c.state
	}
	c.cmd.Wait() //nolint:errcheck // the state says it all
	c.state = c.cmd.ProcessState
	c.reaped = true
	close(c.release)
	if c.state == nil {
		c.state = &os.ProcessState{}
	}
	return c.state
}

// refresh records the groups' membership in the ledger when it changed
// (DESIGN "Ledger": a crashed supervisor's kernels carry no container ID, and
// only an exact identity match with this snapshot ties them to the
// container).
func (r *runner) refresh() {
	if r.o.Store == nil {
		return
	}
	now := time.Now().UTC()
	var snaps []ledger.Tree
	changed := false
	for _, g := range r.groups() {
		t := ledger.Tree{PGID: g, UID: -2, Source: SnapshotSource, SeenAt: now}
		var key strings.Builder
		for _, m := range pgkill.Members(r.o.Root, g) {
			id, err := fingerprint.Read(r.o.Root, m.PID)
			if err != nil || id.StartTicks != m.StartTicks || id.PGID != g {
				continue
			}
			t.Members = append(t.Members, ledger.Process{PID: id.PID, StartTicks: id.StartTicks, Comm: id.Comm})
			switch {
			case t.UID == -2:
				t.UID = id.UID
			case t.UID != id.UID:
				t.UID = -1
			}
			fmt.Fprintf(&key, "%d:%d ", id.PID, id.StartTicks)
		}
		if t.UID == -2 {
			t.UID = -1
		}
		// Under rootless podman the wrapper runs in podman's user
		// namespace: the ledger holds host UIDs, as the hook writes them.
		if t.UID >= 0 {
			if tr, err := userns.SelfTranslator(); err == nil {
				if t.UID, err = tr.Host(t.UID); err != nil {
					t.UID = -1
				}
			}
		}
		if len(t.Members) == 0 {
			continue
		}
		if r.snaps[g] != key.String() {
			changed = true
			r.snaps[g] = key.String()
		}
		snaps = append(snaps, t)
	}
	if !changed {
		return
	}
	err := r.o.Store.Update(r.o.ContainerID, func(rec *ledger.Record) error {
		rec.Trees = slices.DeleteFunc(rec.Trees, func(t ledger.Tree) bool {
			return slices.ContainsFunc(snaps, func(s ledger.Tree) bool { return s.PGID == t.PGID })
		})
		rec.Trees = append(rec.Trees, snaps...)
		return nil
	})
	if err != nil {
		r.log.Warn("could not refresh the ledger snapshot", "err", err)
		clear(r.snaps) // try again next time
		return
	}
	r.log.Debug("ledger snapshot refreshed", "groups", len(snaps))
}

// recordOutcome marks the wrapper's snapshots with what became of them.
func (r *runner) recordOutcome(a action.Action, msg string) {
	if r.o.Store == nil || len(r.snaps) == 0 {
		return
	}
	err := r.o.Store.Update(r.o.ContainerID, func(rec *ledger.Record) error {
		for i := range rec.Trees {
			t := &rec.Trees[i]
			if _, ours := r.snaps[t.PGID]; ours && t.Source == SnapshotSource {
				t.Action, t.Error = a, msg
			}
		}
		return nil
	})
	if err != nil {
		r.log.Warn("could not record the outcome", "err", err)
	}
}
