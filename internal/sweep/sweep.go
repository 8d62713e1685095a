package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"

	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// Verdict is the outcome of the gates for one socket.
type Verdict string

// Verdicts.
const (
	VerdictLive    Verdict = "live"
	VerdictStale   Verdict = "stale"
	VerdictUnknown Verdict = "unknown"
)

// Action is what the sweep did with a socket.
type Action string

// Actions.
const (
	ActionKept        Action = "kept"
	ActionWouldUnlink Action = "would-unlink"
	ActionUnlinked    Action = "unlinked"
	ActionFailed      Action = "failed"
)

// Defaults for Config.
const (
	// The seed culler's probe: connect within 3 s, an answer within 5 s,
	// a second try 2 s after a silent first. A slow but live supervisor
	// is then live, not unknown; the workers keep a sweep of many silent
	// sockets at about two timeouts and a pause.
	DefaultWorkers     = 64
	DefaultDialTimeout = kallichore.DefaultDialTimeout
	DefaultTimeout     = kallichore.DefaultTimeout
	DefaultPause       = 2 * time.Second
	// DefaultDeadline bounds a sweep's probing: a user who owns /tmp's
	// sockets can make every one of them hang until its timeout, and a
	// sweep must still end (watch's rounds, cron's runs).
	DefaultDeadline = 30 * time.Second
	// DefaultHashedMinAge is how long a hashed-name socket must have
	// existed before it may be called stale: far longer than any server
	// takes from bind(2) to listen(2), short enough that leftovers go on
	// the next sweep.
	DefaultHashedMinAge = 2 * time.Minute
)

// Config configures a sweep.
type Config struct {
	// Dirs are the socket directories, as paths inside the target; the
	// last component may hold wildcards. Empty means DefaultDirs plus
	// the directories the target's live supervisors use (their argv's
	// --socket-dir and --unix-socket, their XDG_RUNTIME_DIR and TMPDIR;
	// in a container without one, its init's environment), and then
	// directories that do not exist are skipped silently.
	Dirs []string
	// Target is the host (zero value) or a container.
	Target Target
	// Namespaces, when set, is shared by the sweeps of several
	// containers in a row (a watch round): the host's processes by PID
	// namespace, listed once for them all (NSIndex).
	Namespaces *NSIndex
	// SupervisorComms are the comm values a socket's owner may have
	// (default: kcserver).
	SupervisorComms []string
	// Workers bounds concurrent probes (default DefaultWorkers).
	Workers int
	// Deadline bounds all probing (default DefaultDeadline): a socket not
	// probed by then is unknown, and kept.
	Deadline time.Duration
	// Budget bounds the bytes of /status answers read at once, shared
	// with whatever else uses it (nil: a budget of this sweep's own).
	Budget *kallichore.Budget
	// DialTimeout bounds connect(2) in gates 2 and 3; Timeout bounds one
	// GET /status; Pause separates gate 3's two attempts.
	DialTimeout, Timeout, Pause time.Duration
	// HashedMinAge is the least age (since the socket file's ctime) at
	// which a hashed-name socket, kc-<hex>.sock, may be stale (default
	// DefaultHashedMinAge). Such a name carries no PID, so there is no
	// owner whose start time could show that a silent socket is merely
	// new; its age is the only stand-in.
	HashedMinAge time.Duration
	// Now is the clock ages are measured against (nil: time.Now); tests
	// set it to age sockets without waiting.
	Now func() time.Time
	// Apply unlinks stale sockets; otherwise the sweep is a dry run.
	Apply bool
	// KeepDirs leaves the directories open after Sweep returns, for
	// Socket.Pin, until the report's Close.
	KeepDirs bool
	// Logger receives one record per socket (nil: discard).
	Logger *slog.Logger
	// ProcRoot is the host's procfs (default /proc); for tests.
	ProcRoot string
	// defaultDirs replaces DefaultDirs when no Dirs are given, so that
	// tests can exercise discovery with Apply without sweeping /tmp.
	defaultDirs []string
	// subUIDFile replaces /etc/subuid, for tests.
	subUIDFile string
	// maxNames replaces the sockets a directory's listing keeps, for
	// tests.
	maxNames int
}

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Deadline <= 0 {
		c.Deadline = DefaultDeadline
	}
	if c.Budget == nil {
		c.Budget = kallichore.NewBudget(0)
	}
	if c.defaultDirs == nil {
		c.defaultDirs = DefaultDirs
	}
	if c.subUIDFile == "" {
		c.subUIDFile = "/etc/subuid"
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Pause <= 0 {
		c.Pause = DefaultPause
	}
	if c.HashedMinAge <= 0 {
		c.HashedMinAge = DefaultHashedMinAge
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if len(c.SupervisorComms) == 0 {
		c.SupervisorComms = []string{trees.DefaultComm}
	}
	if c.ProcRoot == "" {
		c.ProcRoot = fingerprint.DefaultRoot
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Socket is one swept socket file and what became of it.
type Socket struct {
	Path    string       // host-visible path
	PID     int          // from the name, in the target's PID namespace; 0 if Hashed
	Kind    sockets.Kind // control or session
	Session string       // <x> of a session socket
	Hashed  bool         // a hashed name, kc-<hex>.sock: no PID, judged without gate 1
	Verdict Verdict      // live, stale or unknown
	Reason  string       // why, gate by gate
	Action  Action       // kept, would-unlink, unlinked or failed
	Err     error        // set when Action is failed
	// UID is the file's owner as classified; ID its identity.
	UID int
	ID  sockets.File
	// Owner is who answers through it count against in a shared read
	// budget (kallichore.Socket.Owner): the user a subordinate UID is
	// one of, a container's root apart from the host's; 0 for the
	// host's root.
	Owner int

	e *entry
	// cut says the deadline (or the caller) ended probing before this
	// socket's verdict could be reached.
	cut   bool
	gates [3]say
	why   [3]string
	tries []statusTry
}

// budgetOwner is the key a socket of uid (a subordinate UID mapped to its
// user already) counts against in the read budget: root inside a
// container is the container's, not the host's, and is bounded apart.
func budgetOwner(t Target, uid int) int {
	if uid == 0 && t.Container() {
		return -t.InitPID
	}
	return uid
}

// Unprobed reports whether the sweep's deadline (or its caller) ended
// probing before s was probed: its verdict is unknown for want of time.
func (s *Socket) Unprobed() bool { return s.cut }

// OwnerListens reports whether gates 1 and 2 found s named for a live
// supervisor of its owner and listening, and /status never answered: a
// server there that was only slow. One that answered as another server,
// or as no Kallichore, is not the supervisor the name says.
func (s *Socket) OwnerListens() bool {
	if s.Hashed || s.gates[0] != sayLive || s.gates[1] != sayLive {
		return false
	}
	for _, t := range s.tries {
		if t.answered {
			return false
		}
	}
	return true
}

// Pin holds s's socket file open for dialling, through the directory the
// sweep listed it in (Config.KeepDirs), if it is still the socket
// classified (sockets.ErrChanged if not). Nothing is looked up by path:
// a mount or symlink put on the way since cannot lead elsewhere, nor
// hold the caller on a user's FUSE server.
func (s *Socket) Pin() (sockets.Pinned, error) {
	if s.e == nil || s.e.dir.f == nil {
		return sockets.Pinned{}, fmt.Errorf("%s: the sweep's directory is closed", s.Path)
	}
	pin, err := s.e.pin()
	if err != nil {
		return pin, fmt.Errorf("%s: %w", s.Path, err)
	}
	return pin, nil
}

// Report is the result of a sweep.
type Report struct {
	DryRun  bool
	Sockets []*Socket
	// Dirs are the directories (and patterns) looked in, with where each
	// came from.
	Dirs []Dir
	// DirErrors are directories that could not be opened or read. A
	// missing default directory is not an error, nor is a discovered
	// directory that was refused (see Dir.Refused).
	DirErrors []error
	// Unprobed counts the sockets left unknown because the deadline
	// passed before they were probed.
	Unprobed int

	dirs []*dir // open with Config.KeepDirs, until Close
}

// Close closes the directories a sweep with Config.KeepDirs left open;
// Socket.Pin fails after it. A report may be closed more than once.
func (r *Report) Close() {
	if r == nil {
		return
	}
	for _, d := range r.dirs {
		d.close()
	}
	r.dirs = nil
}

// Failed reports whether an unlink failed.
func (r *Report) Failed() bool {
	for _, s := range r.Sockets {
		if s.Action == ActionFailed {
			return true
		}
	}
	return false
}

// Sweep finds supervisor sockets, classifies them and, with cfg.Apply,
// unlinks the stale ones. It returns an error only when it cannot start
// (e.g. the container's namespaces cannot be read); per-directory and
// per-socket problems are in the report.
func Sweep(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	rep := &Report{DryRun: !cfg.Apply}
	// Taken before the directories are read: a socket created while the
	// sweep runs then looks younger, never older, than it is.
	now := cfg.Now()

	boot, err := bootEpoch()
	if err != nil {
		return nil, fmt.Errorf("boot time: %w", err)
	}
	view := hostView(cfg.ProcRoot)
	var init *fingerprint.Pinned
	if cfg.Target.Container() {
		// Everything below looks the container up by its init's PID: the
		// init is held from here to the last such look, and a PID that
		// names another process by then (the container stopped, the
		// number reused) is no container of the caller's.
		if cfg.Target.StartTicks != 0 {
			if init, err = fingerprint.Pin(cfg.ProcRoot, fingerprint.Stat{PID: cfg.Target.InitPID, StartTicks: cfg.Target.StartTicks}); err != nil {
				return nil, fmt.Errorf("container init %d is not the process the container was resolved to (it stopped?): %w", cfg.Target.InitPID, err)
			}
			defer init.Close()
		}
		if view, err = containerView(cfg.ProcRoot, cfg.Target.InitPID, cfg.Namespaces); err != nil {
			return nil, err
		}
	}
	// A rootless user's subordinate UIDs are his, in every share below.
	owner := readSubIDs(cfg.subUIDFile).owner
	dirs, guard := openAll(cfg, view, rep, owner)
	defer guard.Close()
	if cfg.KeepDirs {
		rep.dirs = dirs
	} else {
		defer func() {
			for _, d := range dirs {
				d.close()
			}
		}()
	}

	lim := limits{maxNames, maxOthers, maxEntries}
	if cfg.maxNames > 0 {
		lim.names = cfg.maxNames
	}
	var all []*Socket
	caps := shareOut(dirs, lim)
	for i, d := range dirs {
		dlim := lim
		dlim.names = caps[i]
		ents, err := d.scan(guard, dlim, owner)
		if err != nil {
			rep.DirErrors = append(rep.DirErrors, err)
		}
		if d.othersLeft > 0 {
			cfg.Logger.Warn("names of sockets that are other files, left out of the report", "dir", d.shown, "count", d.othersLeft, "reported", maxOthers)
		}
		for _, e := range ents {
			s := &Socket{
				Path: e.shownPath(), PID: e.parsed.PID, Kind: e.parsed.Kind, Session: e.parsed.Session, Hashed: e.parsed.Hashed(),
				UID: e.uid, ID: sockets.File{Dev: e.dev, Ino: e.ino, UID: e.uid, CtimeSec: e.ctime.Sec, CtimeNsec: e.ctime.Nsec}, e: e,
				Owner: budgetOwner(cfg.Target, owner(e.uid)),
			}
			if e.err != nil {
				// One entry nobody can lstat (a FUSE mount of another
				// user's, an I/O error) says nothing about its neighbours.
				s.UID, s.Verdict, s.Reason = -1, VerdictUnknown, "cannot lstat: "+e.err.Error()
				cfg.Logger.Warn("socket directory entry unreadable, kept", "path", s.Path, "err", e.err)
			}
			all = append(all, s)
		}
	}

	// Read after the scan: a socket file the scan saw was bound before
	// this read, so if its socket is still open, net/unix lists it. (One
	// bound later is a new file, which UnlinkAt tells from the one seen.)
	nu, err := netUnix(cfg)
	if err != nil {
		// Gate 2 still has connect(2), but without net/unix nothing tells
		// a refusing socket that a process holds from a dead one: gate 2
		// stays "unsure" for those.
		cfg.Logger.Warn("cannot read net/unix", "err", err)
		nu = nil
	}
	if init != nil && init.Exited() {
		// Its PID may have named another process in any look above.
		rep.Close()
		return nil, fmt.Errorf("container init %d exited during the sweep: nothing judged, nothing unlinked", cfg.Target.InitPID)
	}

	// Every probe below runs under the deadline; the caller's ctx still
	// says whether the run as a whole was cancelled.
	pctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
	defer cancel()
	client := &kallichore.Client{DialTimeout: cfg.DialTimeout, Timeout: cfg.Timeout, Budget: cfg.Budget}
	var controls, sessions, hashed []*Socket
	for _, s := range all {
		switch {
		case s.e.err != nil:
		case !s.e.isSocket():
			s.Verdict, s.Reason = VerdictUnknown, "not a socket ("+FileType(s.e.mode)+")"
		case s.Hashed:
			hashed = append(hashed, s)
		case s.Kind == sockets.KindControl:
			controls = append(controls, s)
		default:
			sessions = append(sessions, s)
		}
	}
	// Hashed-name sockets have no server to follow, so they are probed
	// like control sockets (gates 2 and 3, in the same rounds); gate 1
	// needs a PID they do not have.
	probes := byOwnerTurns(byInode(append(append([]*Socket(nil), controls...), hashed...)), owner)
	// The server rounds end early enough for the session sockets of the
	// servers they judged to be dialed: one user's hung servers, which
	// can fill the rounds up to the deadline, never leave every session
	// socket of everyone unprobed.
	rctx, rcancel := pctx, context.CancelFunc(func() {})
	if len(sessions) > 0 {
		reserve := min(cfg.Deadline/4, max(2*cfg.DialTimeout, cfg.Deadline/10))
		rctx, rcancel = context.WithTimeout(pctx, cfg.Deadline-reserve)
	}
	defer rcancel()

	// Round 1: all three gates on control sockets, gates 2 and 3 on
	// hashed ones (gate 3's first try). A first try that was silent on a
	// socket that does not listen is handed to round 2, which asks again
	// once the pause has passed since that try: the rounds overlap, so
	// hung servers in round 1 do not hold back everyone's second try.
	// (The second silence is what gate 3 needs to call a socket dead; one
	// that listens cannot be stale whatever /status says, so asking it
	// again would only wait out a second timeout for nothing.)
	//
	// The network is asked once per socket inode: hard links to one hung
	// socket cost one timeout, not one each. Gates 1 and 2's reading of
	// net/unix depend on the name and are decided per name.
	second := make(chan *probe, len(probes))
	var round2 sync.WaitGroup
	for i := 0; i < min(cfg.Workers, len(probes)); i++ {
		round2.Add(1)
		go func() {
			defer round2.Done()
			for p := range second {
				select {
				case <-time.After(time.Until(p.triedAt.Add(cfg.Pause))):
				case <-rctx.Done():
					p.cut = true
					continue
				}
				t := p.status(rctx, client)
				if rctx.Err() != nil {
					p.cut = true
					continue
				}
				p.tries = append(p.tries, t)
			}
		}()
	}
	pool(rctx, cfg.Workers, probes, func(p *probe) {
		dialErr := p.dial(rctx, cfg.DialTimeout)
		if rctx.Err() != nil {
			p.cut = true
			return
		}
		ask, again := false, false
		for _, s := range p.names {
			if !s.Hashed {
				s.gates[0], s.why[0] = ownerGate(view, s.PID, s.e.uid, cfg.SupervisorComms, s.e.changed, boot)
			}
			s.gates[1], s.why[1] = judgeListen(dialErr, s.e.innerPath(), s.e.file(), nu)
			// A session socket carries a kernel's channel stream, not
			// HTTP: asking a hashed name that something holds /status
			// would only wait out the timeout, and the holder already
			// makes it live.
			ask = ask || !s.Hashed || s.gates[1] != sayLive
			again = again || s.gates[1] != sayLive
		}
		if !ask {
			return
		}
		t := p.status(rctx, client)
		if rctx.Err() != nil {
			p.cut = true
			return
		}
		p.tries = append(p.tries, t)
		if !t.answered && again {
			p.triedAt = time.Now()
			second <- p
		}
	}, func(p *probe) { p.cut = true })
	close(second)
	round2.Wait()
	for _, p := range probes {
		for _, s := range p.names {
			s.tries, s.cut = p.tries, p.cut
		}
	}
	byServer := map[serverKey]*Socket{}
	for _, s := range controls {
		if s.cut {
			s.Verdict, s.Reason = VerdictUnknown, notProbed(ctx, cfg.Deadline)
		} else {
			s.gates[2], s.why[2] = statusGate(s.PID, s.tries...)
			s.Verdict, s.Reason = compose(s.gates, s.why)
		}
		byServer[serverKey{s.e.dir, s.PID, s.e.uid}] = s
	}
	for _, s := range hashed {
		if s.cut {
			s.Verdict, s.Reason = VerdictUnknown, hashedHead+"; "+notProbed(ctx, cfg.Deadline)
			continue
		}
		changed := time.Unix(s.e.ctime.Unix())
		s.Verdict, s.Reason = judgeHashed(s, now.Sub(changed), cfg.HashedMinAge)
	}

	// Session sockets follow their server's control socket in the same
	// directory, of the same owner; without one they are judged on gates
	// 1 and 2 alone, with gate 3 counted as silent (there is no /status
	// to ask).
	var dial []*Socket
	for _, s := range sessions {
		srv := byServer[serverKey{s.e.dir, s.PID, s.e.uid}]
		switch {
		case srv != nil && srv.Verdict == VerdictLive:
			s.Verdict, s.Reason = VerdictLive, "its server "+srv.e.name+" is live"
		case srv != nil && srv.Verdict == VerdictUnknown:
			s.Verdict, s.Reason = VerdictUnknown, "its server "+srv.e.name+" is unknown"
		default:
			dial = append(dial, s)
		}
	}
	dialed := byOwnerTurns(byInode(dial), owner)
	pool(pctx, cfg.Workers, dialed, func(p *probe) {
		err := p.dial(pctx, cfg.DialTimeout)
		if pctx.Err() != nil {
			p.cut = true
			return
		}
		for _, s := range p.names {
			srv := byServer[serverKey{s.e.dir, s.PID, s.e.uid}]
			g, why := judgeListen(err, s.e.innerPath(), s.e.file(), nu)
			switch {
			case srv != nil && g == sayStale:
				s.Verdict, s.Reason = VerdictStale, "its server "+srv.e.name+" is stale; "+why
			case srv != nil:
				s.Verdict, s.Reason = VerdictUnknown, "its server "+srv.e.name+" is stale, but this socket: "+why
			default:
				s.gates[0], s.why[0] = ownerGate(view, s.PID, s.e.uid, cfg.SupervisorComms, s.e.changed, boot)
				s.gates[1], s.why[1] = g, why
				s.gates[2], s.why[2] = sayStale, fmt.Sprintf("no control socket kc-%d.sock", s.PID)
				s.Verdict, s.Reason = compose(s.gates, s.why)
			}
		}
	}, func(p *probe) { p.cut = true })
	for _, p := range dialed {
		for _, s := range p.names {
			if s.cut = p.cut; s.cut {
				s.Verdict, s.Reason = VerdictUnknown, notProbed(ctx, cfg.Deadline)
			}
		}
	}

	for _, s := range all {
		if s.cut && ctx.Err() == nil {
			rep.Unprobed++
		}
	}
	if rep.Unprobed > 0 {
		cfg.Logger.Warn("sweep deadline passed: sockets not probed by then are unknown and kept",
			"deadline", cfg.Deadline.String(), "unprobed", rep.Unprobed)
	}
	actAll(cfg, all)
	sort.Slice(all, func(i, j int) bool { return all[i].Path < all[j].Path })
	rep.Sockets = all
	return rep, ctx.Err()
}

// notProbed is the reason given for a socket whose probing was cut short.
func notProbed(ctx context.Context, deadline time.Duration) string {
	if err := ctx.Err(); err != nil {
		return "not probed: " + err.Error()
	}
	return fmt.Sprintf("not probed: the sweep deadline (%s) passed first", deadline)
}

// netUnix reads the Unix socket table of the target's network namespace
// (ours: the host's, or a container's on the host network; else the
// container's init's) from sock_diag, where a bound name cannot forge a
// line and each socket is known by its file too (sockets.DiagNetUnix);
// failing that, from net/unix, which knows only the binders' paths.
func netUnix(cfg Config) (sockets.NetUnix, error) {
	if cfg.ProcRoot == fingerprint.DefaultRoot {
		nu, err := diagNetUnix(cfg)
		if err == nil {
			return nu, nil
		}
		cfg.Logger.Warn("cannot ask sock_diag for Unix sockets: reading net/unix, where a socket name can forge a line and a socket is known only by its binder's path", "err", err)
	}
	return sockets.ReadNetUnix(cfg.ProcRoot, cfg.Target.InitPID)
}

func diagNetUnix(cfg Config) (sockets.NetUnix, error) {
	if sameNetNS(cfg.ProcRoot, cfg.Target.InitPID) {
		return sockets.DiagNetUnix()
	}
	ns, err := os.Open(cfg.ProcRoot + "/" + strconv.Itoa(cfg.Target.InitPID) + "/ns/net")
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return sockets.DiagNetUnixIn(ns)
}

// sameNetNS reports whether pid (0: none, the host) runs in our network
// namespace.
func sameNetNS(procRoot string, pid int) bool {
	if pid == 0 {
		return true
	}
	var ours, theirs unix.Stat_t
	return unix.Stat(procRoot+"/self/ns/net", &ours) == nil &&
		unix.Stat(procRoot+"/"+strconv.Itoa(pid)+"/ns/net", &theirs) == nil &&
		ours.Dev == theirs.Dev && ours.Ino == theirs.Ino
}

// probe is what the network said of one socket inode, shared by all the
// names it was found under.
type probe struct {
	names   []*Socket
	tries   []statusTry
	triedAt time.Time // when gate 3's first try ended
	cut     bool
}

// byInode groups socks by the inode they name, in their order.
func byInode(socks []*Socket) []*probe {
	type key struct{ dev, ino uint64 }
	idx := map[key]*probe{}
	var out []*probe
	for _, s := range socks {
		k := key{s.e.dev, s.e.ino}
		p := idx[k]
		if p == nil {
			p = &probe{}
			idx[k] = p
			out = append(out, p)
		}
		p.names = append(p.names, s)
	}
	return out
}

type serverKey struct {
	d   *dir
	pid int
	// uid owns both: another user's kc-<pid>.sock, planted for a PID a
	// supervisor gets later, is no server of its sockets.
	uid int
}

// compose turns the gates' opinions into a verdict: stale or live only
// when all three agree.
func compose(g [3]say, why [3]string) (Verdict, string) {
	v := VerdictUnknown
	switch {
	case g[0] == sayStale && g[1] == sayStale && g[2] == sayStale:
		v = VerdictStale
	case g[0] == sayLive && g[1] == sayLive && g[2] == sayLive:
		v = VerdictLive
	}
	reason := strings.Join(why[:], "; ")
	if v == VerdictUnknown {
		reason = "gates disagree: " + reason
	}
	return v, reason
}

// hashedHead starts every reason given for a hashed-name socket.
const hashedHead = "hashed name: no PID to check"

// judgeHashed decides on a hashed-name socket from gates 2 and 3 and its
// age (since its ctime). Stale needs all three: connect refused with no
// socket bound to the path in net/unix, /status silent twice, and at least
// minAge old. Listening, a socket bound to the path, or any answer means a
// process has it: live. Everything else is unknown, and kept.
func judgeHashed(s *Socket, age, minAge time.Duration) (Verdict, string) {
	if s.gates[1] == sayLive {
		return VerdictLive, hashedHead + "; " + s.why[1]
	}
	if len(s.tries) == 0 {
		// Not probed (the sweep was cancelled): pool left its why.
		return VerdictUnknown, hashedHead + "; " + s.why[0]
	}
	reason := hashedHead + "; " + s.why[1]
	for _, t := range s.tries {
		switch {
		case t.answered && t.other != "":
			return VerdictLive, reason + "; something answers /status: " + t.other
		case t.answered && t.unread != "":
			return VerdictLive, reason + "; /status answered, but the answer was not read: " + t.unread
		case t.answered:
			return VerdictLive, reason + "; /status answers with process_id " + strconv.Itoa(t.pid)
		}
	}
	if s.gates[1] == sayLive {
		return VerdictLive, reason
	}
	// Nobody answered, so gate 3's wording for silence applies as is
	// (the PID it is given only matters for answers).
	g3, why3 := statusGate(0, s.tries...)
	reason += "; " + why3
	if s.gates[1] != sayStale || g3 != sayStale {
		return VerdictUnknown, reason
	}
	// Gate 2 found no socket bound to the path, so a socket between
	// bind(2) and listen(2) is already ruled out; the age stays as a
	// second line of defence, for a binder net/unix cannot show (one that
	// bound the file under another path, say through a symlink).
	switch {
	case age < 0:
		// The clock was stepped back since: the age is unknown.
		return VerdictUnknown, fmt.Sprintf("%s; but its ctime is %s in the future, so its age against the %s minimum age for hashed names is unknown",
			reason, (-age).Round(time.Second), minAge)
	case age < minAge:
		return VerdictUnknown, fmt.Sprintf("%s; but its ctime is only %s old, under the %s minimum age for hashed names (it may be bound and not yet listening)",
			reason, age.Round(time.Second), minAge)
	}
	return VerdictStale, fmt.Sprintf("%s; not listening, ctime %s old (minimum age %s)", reason, age.Round(time.Second), minAge)
}

// actAll acts on every socket. Stale names of one socket file (hard
// links) are unlinked holding the file (O_PATH, pinned by the first as
// classified): unlinking one name moves the file's change time, which the
// next name's check (UnlinkAt) would take for another socket, every run.
// Held, the inode cannot be freed and its number reused, so the change
// time each check expects is the one read through the hold.
func actAll(cfg Config, all []*Socket) {
	type fileKey [2]uint64
	key := func(s *Socket) (fileKey, bool) {
		return fileKey{s.ID.Dev, s.ID.Ino}, cfg.Apply && s.Verdict == VerdictStale && s.e != nil && s.e.err == nil && s.ID.Ino != 0
	}
	names := map[fileKey]int{}
	for _, s := range all {
		if k, ok := key(s); ok {
			names[k]++
		}
	}
	held := map[fileKey]sockets.Pinned{}
	defer func() {
		for _, p := range held {
			p.Release()
		}
	}()
	for _, s := range all {
		if k, ok := key(s); ok && names[k] > 1 {
			pin, ok := held[k]
			if !ok {
				if p, err := s.e.pin(); err == nil {
					pin, ok = p, true
					held[k] = p
				}
			}
			if ok {
				if st, err := pin.Fstat(); err == nil {
					s.ID.CtimeSec, s.ID.CtimeNsec = st.Ctim.Sec, st.Ctim.Nsec
				}
			}
		}
		act(cfg, s)
	}
}

// act decides and performs the action for one classified socket.
func act(cfg Config, s *Socket) {
	log := cfg.Logger.With("path", s.Path, "pid", s.PID, "kind", string(s.Kind), "verdict", string(s.Verdict), "reason", s.Reason)
	if s.Hashed {
		// pid=0 alone would read as a parse failure.
		log = log.With("hashed", true)
	}
	s.Action = ActionKept
	if s.Verdict != VerdictStale {
		log.Debug("kept")
		return
	}
	if ok, why := s.e.dir.ownerOK(s.UID); !ok {
		s.Reason += "; not unlinked: " + why
		log.Warn("stale socket kept", "why", why)
		return
	}
	if !cfg.Apply {
		s.Action = ActionWouldUnlink
		log.Info("[DRY-RUN] would unlink")
		return
	}
	err := sockets.UnlinkAt(s.e.dir.fd, s.e.name, s.ID)
	switch {
	case err == nil:
		s.Action = ActionUnlinked
		log.Info("[SWEEP] unlinked")
	case errors.Is(err, sockets.ErrGone):
		s.Reason += "; already gone"
		log.Info("already gone")
	case errors.Is(err, sockets.ErrChanged):
		s.Reason += "; not unlinked: " + err.Error()
		log.Warn("changed since classified, kept", "err", err)
	default:
		s.Action, s.Err = ActionFailed, err
		log.Error("unlink failed", "err", err)
	}
}

// pool runs f on every item with at most n at a time. Items not started
// when ctx ends are given to skip instead.
func pool[T any](ctx context.Context, n int, items []T, f, skip func(T)) {
	if n > len(items) {
		n = len(items)
	}
	ch := make(chan T)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				f(it)
			}
		}()
	}
	for _, it := range items {
		if ctx.Err() != nil {
			skip(it)
			continue
		}
		select {
		case ch <- it:
		case <-ctx.Done():
			skip(it)
		}
	}
	close(ch)
	wg.Wait()
}
