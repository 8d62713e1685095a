package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/contain/systemd"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/podman"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// plan says which settings a command takes beyond the global flags.
type plan struct {
	scan   bool // reconcileFlags: the scan, the decision table, --container
	probe  bool // probeFlags: the socket probing settings
	target bool // sweep's --container or --container-pid
	idle   bool // --idle
	// noReport: the command prints no report (watch, version), so stderr
	// gets info lines by default; a report holds every finding, and its
	// command logs only warnings there unless told otherwise.
	noReport bool
	// logEnv names the environment variable giving the log file when
	// --log-file is not set (the seed scripts' KC_SWEEPER_LOG).
	logEnv string
	// check refuses the command's own malformed flags before the log
	// file is opened.
	check func(globals) error
}

// session is a command's settings, resolved once, and its logger.
type session struct {
	g   globals
	s   janitor.Settings
	log *slog.Logger
	// close closes the log file.
	close func()
}

// preamble turns the flags into settings the same way for every command:
// the global flags, the engines, the scan, the sockets, then the command's
// own checks, then the logger (tagged with the command's name), and last
// the container to look into, which asks the engines. Any malformed
// setting is a usage error (exit 2).
func preamble(c *cli.Context, name string, p plan) (*session, error) {
	g, err := loadGlobals(c)
	if err != nil {
		return nil, err
	}
	if err := checkPodmanURL(g); err != nil {
		return nil, err
	}
	var opt reconcile.Options
	if p.scan {
		if opt, err = reconcileOptions(c, g); err != nil {
			return nil, err
		}
	}
	se := &session{g: g, s: settingsOf(c, g, opt)}
	if p.probe || p.target {
		if se.s.Sockets, err = probeConfig(c, g); err != nil {
			return nil, err
		}
	}
	if p.idle {
		if se.s.Threshold, err = cull.ParseIdle(c.String(flagIdle)); err != nil {
			return nil, usageErr("--idle: %v", err)
		}
	}
	if p.check != nil {
		if err := p.check(g); err != nil {
			return nil, err
		}
	}
	lg, logFile := g.reporting(), g.LogFile
	if p.noReport {
		lg = g
	}
	if logFile == "" && p.logEnv != "" {
		logFile = os.Getenv(p.logEnv)
	}
	log, closeLog, err := newLogger(lg, logFile)
	if err != nil {
		return nil, err
	}
	se.log, se.close = log.With("cmd", name), closeLog
	se.s.Reconcile.Logger = se.log
	if p.target {
		if se.s.Sockets.Target, err = sweepTarget(c, g); err != nil {
			closeLog()
			return nil, err
		}
	}
	return se, nil
}

// settingsOf is the settings every pass of internal/janitor takes: the
// engines, the state dir and the scan options opt.
func settingsOf(c *cli.Context, g globals, opt reconcile.Options) janitor.Settings {
	return janitor.Settings{Engines: g.Engines, Engine: engineConfig(c, g, nil), StateDir: g.StateDir, Reconcile: opt}
}

func reconcileOptions(c *cli.Context, g globals) (reconcile.Options, error) {
	opt := reconcile.Options{
		Comms:  g.SupervisorComms,
		MinAge: c.Duration("min-age"),
		// 0 is "at once" here (after --min-age); inside, 0 is the default.
		LedgerRetention: max(c.Duration("ledger-retention"), time.Nanosecond),
		KillGrace:       c.Duration("kill-grace"),
		FullScan:        c.Bool("full-scan"),
		MaxReap:         c.Int("max-reap"),
		// A scope a supervised tree was started in is stopped through
		// systemd where PID 1 is systemd.
		Contain: contain.Options{Systemd: systemd.Scoper},
	}
	if c.Duration("ledger-retention") < 0 {
		return opt, usageErr("--ledger-retention must not be negative")
	}
	if opt.MaxReap < 1 {
		return opt, usageErr("--max-reap must be at least 1")
	}
	lister, err := proctable.ParseLister(c.String("bpf"))
	if err != nil {
		return opt, usageErr("--bpf: %v", err)
	}
	opt.Lister = lister
	if opt.MinAge < 0 {
		return opt, usageErr("--min-age must not be negative")
	}
	if opt.KillGrace <= 0 {
		return opt, usageErr("--kill-grace must be positive")
	}
	if err := checkEngines(c, g); err != nil {
		return opt, err
	}
	// Only once every engine setting is known good: resolving a name asks
	// the engines.
	for _, ref := range c.StringSlice("container") {
		m, err := resolveContainer(c.Context, c, g, ref, false)
		if err != nil {
			return opt, err
		}
		if opt.Containers == nil {
			opt.Containers = map[string]bool{}
		}
		opt.Containers[m.ID] = true
	}
	// doctor, status and watch share these options and also look at
	// sockets.
	if err := checkSocketDirs(c); err != nil {
		return opt, err
	}
	return opt, nil
}

// checkPodmanURL refuses a malformed --podman-url up front: it is a usage
// error, not podman being unreachable.
func checkPodmanURL(g globals) error {
	if g.PodmanURL == "" {
		return nil
	}
	if err := podman.CheckURL(g.PodmanURL); err != nil {
		return usageErr("--podman-url: %v", err)
	}
	return nil
}

// probeConfig builds the socket probing settings every command with
// probeFlags shares; sweepTarget adds the container to look into.
func probeConfig(c *cli.Context, g globals) (sweep.Config, error) {
	cfg := sweep.Config{
		Dirs:            c.StringSlice(flagSocketDir),
		SupervisorComms: g.SupervisorComms,
		Timeout:         c.Duration(flagTimeout),
		Workers:         c.Int(flagWorkers),
		Deadline:        c.Duration(flagDeadline),
		// One budget for the whole run: its sweeps and audits share it.
		Budget: kallichore.NewBudget(0),
	}
	if cfg.Timeout <= 0 {
		return cfg, usageErr("--timeout must be positive")
	}
	if cfg.Deadline <= 0 {
		return cfg, usageErr("--%s must be positive", flagDeadline)
	}
	if cfg.Workers <= 0 {
		return cfg, usageErr("--workers must be positive")
	}
	if err := checkSocketDirs(c); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// sweepTarget is the container sweep and cull look into: --container-pid,
// else --container resolved by the engines, else the host.
func sweepTarget(c *cli.Context, g globals) (sweep.Target, error) {
	if pid := c.Int(flagContainerPID); pid < 0 {
		return sweep.Target{}, usageErr("--container-pid must not be negative")
	} else if pid > 0 {
		if c.IsSet(flagContainer) {
			// A leftover KC_CONTAINER_PID must not send a run meant for
			// one container into another's sockets.
			return sweep.Target{}, usageErr("--container-pid (or KC_CONTAINER_PID) and --container (or KC_CONTAINER) both name a container: give one")
		}
		// Held by its start time now, as a resolved init is: a PID that
		// names another process during the sweep stops it.
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		if err != nil || st.Zombie() {
			return sweep.Target{}, cli.Exit(fmt.Sprintf("--container-pid %d: no such process: its sockets cannot be reached", pid), exitFailed)
		}
		return sweep.Target{InitPID: pid, StartTicks: st.StartTicks}, nil
	}
	name := c.String(flagContainer)
	if name == "" {
		if c.IsSet(flagContainer) {
			// An unset variable in a cron line or unit must not widen
			// a run meant for one container to the whole host.
			return sweep.Target{}, usageErr("--container (or KC_CONTAINER) is set but empty: name the container, or leave it unset to look at the host")
		}
		return sweep.Target{}, nil
	}
	m, err := resolveContainer(c.Context, c, g, name, true)
	if err != nil {
		return sweep.Target{}, err
	}
	t, err := containerTarget(name, m)
	if err != nil {
		return sweep.Target{}, cli.Exit(err.Error(), exitFailed)
	}
	return t, nil
}

// containerTarget is the sweep target of the running container m (which
// ref named): its init PID and, read right after the engine's answer,
// that init's start time, by which the sweep holds it. The engine gave a
// PID, not a process: the one holding it is taken for the init only if
// it may be (janitor.MayBeInit), checked between two reads of its start
// time so that the check is of that process.
func containerTarget(ref string, m engine.Match) (sweep.Target, error) {
	return containerTargetIn(fingerprint.DefaultRoot, ref, m)
}

func containerTargetIn(root, ref string, m engine.Match) (sweep.Target, error) {
	if m.InitPID <= 0 {
		return sweep.Target{}, fmt.Errorf("container %s (%s %s) is not running: its sockets cannot be reached", ref, m.Engine, m.ID)
	}
	gone := fmt.Errorf("container %s (%s %s): its init %d is gone: its sockets cannot be reached", ref, m.Engine, m.ID, m.InitPID)
	st, err := fingerprint.ReadStat(root, m.InitPID)
	if err != nil || st.Zombie() {
		return sweep.Target{}, gone
	}
	notInit := janitor.MayBeInit(root, m.ID, m.InitPID)
	if again, err := fingerprint.ReadStat(root, m.InitPID); err != nil || again.StartTicks != st.StartTicks || again.Zombie() {
		return sweep.Target{}, gone
	}
	if notInit != nil {
		return sweep.Target{}, fmt.Errorf("container %s (%s %s): the init the engine gave may not be its (%v): its sockets are not looked for; if PID %d is right, name it with --container-pid", ref, m.Engine, m.ID, notInit, m.InitPID)
	}
	return sweep.Target{InitPID: m.InitPID, StartTicks: st.StartTicks}, nil
}

// checkSocketDirs refuses --socket-dir patterns the sweep could only
// report as errors: empty, relative, wildcards before the last component,
// a malformed glob.
func checkSocketDirs(c *cli.Context) error {
	for _, p := range c.StringSlice(flagSocketDir) {
		if err := sweep.CheckDirPattern(p); err != nil {
			return usageErr("--socket-dir: %v", err)
		}
	}
	return nil
}
