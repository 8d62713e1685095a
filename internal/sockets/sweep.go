package sockets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
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
	DefaultWorkers     = 64
	DefaultDialTimeout = 300 * time.Millisecond
	DefaultTimeout     = time.Second
	DefaultPause       = 200 * time.Millisecond
)

// Config configures a sweep.
type Config struct {
	// Dirs are the socket directories, as paths inside the target; the
	// last component may hold wildcards. Empty means DefaultDirs, and
	// then directories that do not exist are skipped silently.
	Dirs []string
	// Target is the host (zero value) or a container.
	Target Target
	// SupervisorComms are the comm values a socket's owner may have
	// (default: kcserver).
	SupervisorComms []string
	// Workers bounds concurrent probes (default DefaultWorkers).
	Workers int
	// DialTimeout bounds connect(2) in gates 2 and 3; Timeout bounds one
	// GET /status; Pause separates gate 3's two attempts.
	DialTimeout, Timeout, Pause time.Duration
	// Apply unlinks stale sockets; otherwise the sweep is a dry run.
	Apply bool
	// Logger receives one record per socket (nil: discard).
	Logger *slog.Logger
	// ProcRoot is the host's procfs (default /proc); for tests.
	ProcRoot string
}

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
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
	if len(c.SupervisorComms) == 0 {
		c.SupervisorComms = []string{"kcserver"}
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
	Path    string  // host-visible path
	PID     int     // from the name, in the target's PID namespace
	Kind    Kind    // control or session
	Session string  // <x> of a session socket
	Verdict Verdict // live, stale or unknown
	Reason  string  // why, gate by gate
	Action  Action  // kept, would-unlink, unlinked or failed
	Err     error   // set when Action is failed
	// UID is the file's owner as classified; ID its identity.
	UID int
	ID  FileID

	e     *entry
	gates [3]say
	why   [3]string
	tries []statusTry
}

// Report is the result of a sweep.
type Report struct {
	DryRun  bool
	Sockets []*Socket
	// DirErrors are directories that could not be opened or read. A
	// missing default directory is not an error.
	DirErrors []error
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

	boot, err := bootEpoch()
	if err != nil {
		return nil, fmt.Errorf("boot time: %w", err)
	}
	view := hostView(cfg.ProcRoot)
	if cfg.Target.Container() {
		if view, err = containerView(cfg.ProcRoot, cfg.Target.InitPID); err != nil {
			return nil, err
		}
	}
	ls, err := readListeners(cfg.ProcRoot, cfg.Target.InitPID)
	if err != nil {
		// Gate 2 still has connect(2); without net/unix, ambiguous
		// connect errors stay "unsure".
		cfg.Logger.Warn("cannot read net/unix", "err", err)
		ls = nil
	}

	patterns := cfg.Dirs
	defaultDirs := len(patterns) == 0
	if defaultDirs {
		patterns = DefaultDirs
	}
	dirs, errs := openDirs(cfg.Target, patterns)
	defer func() {
		for _, d := range dirs {
			d.close()
		}
	}()
	for _, err := range errs {
		if defaultDirs && isNotExist(err) {
			continue
		}
		rep.DirErrors = append(rep.DirErrors, err)
	}

	var all []*Socket
	for _, d := range dirs {
		ents, err := d.scan()
		if err != nil {
			rep.DirErrors = append(rep.DirErrors, err)
		}
		for _, e := range ents {
			all = append(all, &Socket{
				Path: e.shownPath(), PID: e.parsed.PID, Kind: e.parsed.Kind, Session: e.parsed.Session,
				UID: e.uid, ID: FileID{Dev: e.dev, Ino: e.ino, UID: e.uid, CtimeSec: e.ctime.Sec, CtimeNsec: e.ctime.Nsec}, e: e,
			})
		}
	}

	client := &kallichore.Client{DialTimeout: cfg.DialTimeout, Timeout: cfg.Timeout}
	var controls, sessions []*Socket
	for _, s := range all {
		switch {
		case !s.e.isSocket():
			s.Verdict, s.Reason = VerdictUnknown, "not a socket ("+fileType(s.e.mode)+")"
		case s.Kind == KindControl:
			controls = append(controls, s)
		default:
			sessions = append(sessions, s)
		}
	}

	// Round 1: all three gates on control sockets (gate 3's first try).
	pool(ctx, cfg.Workers, controls, func(s *Socket) {
		s.gates[0], s.why[0] = ownerGate(view, s.PID, cfg.SupervisorComms, s.e.changed, boot)
		s.gates[1], s.why[1] = listenGate(s.e.dir.fdPath(s.e.name), s.e.innerPath(), ls, cfg.DialTimeout)
		s.tries = append(s.tries, tryStatus(ctx, client, s.e.dir.fdPath(s.e.name)))
	})
	// Round 2, after one pause: a second try where the first was silent.
	var again []*Socket
	for _, s := range controls {
		if len(s.tries) > 0 && !s.tries[0].answered {
			again = append(again, s)
		}
	}
	if len(again) > 0 {
		select {
		case <-time.After(cfg.Pause):
		case <-ctx.Done():
		}
		pool(ctx, cfg.Workers, again, func(s *Socket) {
			s.tries = append(s.tries, tryStatus(ctx, client, s.e.dir.fdPath(s.e.name)))
		})
	}
	byServer := map[serverKey]*Socket{}
	for _, s := range controls {
		s.gates[2], s.why[2] = statusGate(s.PID, s.tries...)
		s.Verdict, s.Reason = compose(s.gates, s.why)
		byServer[serverKey{s.e.dir, s.PID}] = s
	}

	// Session sockets follow their server's control socket in the same
	// directory; without one they are judged on gates 1 and 2 alone,
	// with gate 3 counted as silent (there is no /status to ask).
	pool(ctx, cfg.Workers, sessions, func(s *Socket) {
		srv := byServer[serverKey{s.e.dir, s.PID}]
		dial := s.e.dir.fdPath(s.e.name)
		switch {
		case srv != nil && srv.Verdict == VerdictLive:
			s.Verdict, s.Reason = VerdictLive, "its server "+srv.e.name+" is live"
		case srv != nil && srv.Verdict == VerdictUnknown:
			s.Verdict, s.Reason = VerdictUnknown, "its server "+srv.e.name+" is unknown"
		case srv != nil:
			g, why := listenGate(dial, s.e.innerPath(), ls, cfg.DialTimeout)
			if g == sayStale {
				s.Verdict, s.Reason = VerdictStale, "its server "+srv.e.name+" is stale; "+why
			} else {
				s.Verdict, s.Reason = VerdictUnknown, "its server "+srv.e.name+" is stale, but this socket: "+why
			}
		default:
			s.gates[0], s.why[0] = ownerGate(view, s.PID, cfg.SupervisorComms, s.e.changed, boot)
			s.gates[1], s.why[1] = listenGate(dial, s.e.innerPath(), ls, cfg.DialTimeout)
			s.gates[2], s.why[2] = sayStale, fmt.Sprintf("no control socket kc-%d.sock", s.PID)
			s.Verdict, s.Reason = compose(s.gates, s.why)
		}
	})

	for _, s := range all {
		act(cfg, s)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Path < all[j].Path })
	rep.Sockets = all
	return rep, ctx.Err()
}

type serverKey struct {
	d   *dir
	pid int
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

// act decides and performs the action for one classified socket.
func act(cfg Config, s *Socket) {
	log := cfg.Logger.With("path", s.Path, "pid", s.PID, "kind", string(s.Kind), "verdict", string(s.Verdict), "reason", s.Reason)
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
		log.Info("would unlink")
		return
	}
	err := UnlinkAt(s.e.dir.fd, s.e.name, s.ID)
	switch {
	case err == nil:
		s.Action = ActionUnlinked
		log.Info("unlinked")
	case errors.Is(err, ErrGone):
		s.Reason += "; already gone"
		log.Info("already gone")
	case errors.Is(err, ErrChanged):
		s.Reason += "; not unlinked: " + err.Error()
		log.Warn("changed since classified, kept", "err", err)
	default:
		s.Action, s.Err = ActionFailed, err
		log.Error("unlink failed", "err", err)
	}
}

// pool runs f on every item with at most n at a time.
func pool(ctx context.Context, n int, items []*Socket, f func(*Socket)) {
	if n > len(items) {
		n = len(items)
	}
	ch := make(chan *Socket)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range ch {
				f(s)
			}
		}()
	}
	for _, s := range items {
		if ctx.Err() != nil {
			// Leave the rest unprobed: every gate stays unsure.
			s.why = [3]string{"not probed: " + ctx.Err().Error()}
			continue
		}
		ch <- s
	}
	close(ch)
	wg.Wait()
}
