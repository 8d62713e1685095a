package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"
	"go.podman.io/common/pkg/config"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/liveness"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

const (
	flagHooksDir = "hooks-dir"
	flagIdle     = "idle"
)

func doctorCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.BoolFlag{Name: "fix", Usage: "reap the orphaned supervisor trees found, as reconcile --apply would", EnvVars: []string{"KC_DOCTOR_FIX"}},
		&cli.StringSliceFlag{Name: flagHooksDir, Usage: "oci-hooks(5) descriptor `DIR` podman reads (repeatable, in increasing precedence); default: " +
			doctor.DefaultHooksDir + ", " + doctor.OverrideHooksDir + " and containers.conf's hooks_dir", EnvVars: []string{"KC_HOOKS_DIR"}},
		&cli.StringFlag{Name: flagIdle, Value: "24h", Usage: "a session idle and disconnected longer than `DURATION` (or seconds) counts as abandoned", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
	}
	flags = append(flags, reconcileFlags()...)
	flags = append(flags, probeFlags()...)
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the host: hook installed and firing, container engines reachable, ledger usable, nothing left to clean up",
		Description: `Runs every check and prints one line per check:

   label .... ok|WARN|ERROR (detail)

with details indented below (or one JSON object with --format json).

Checks: hook installed (a valid kc-hook descriptor for poststop and for
createRuntime in podman's hooks dirs, its binary present and executable:
podman silently drops a descriptor whose binary is missing); hook alive
(its log or ledger shows runs since boot); engines (which ones --engine
auto found, and where it looked for the others); one check per engine,
podman, docker, containerd (reachable, version, containers, live, and the
UID its answer vouches for, read from the answering connection; a named
engine that cannot be asked is an ERROR); state dir and ledger; orphaned supervisor trees (a dry-run
reconcile; --fix reaps them as reconcile --apply would); orphan sockets (a
dry-run sweep); abandoned sessions (a cull audit).

Nothing is changed without --fix, and --fix only reaps stray trees.

Exit status: 0 all ok; 1 the worst verdict is WARN; 2 it is ERROR.`,
		Flags:  flags,
		Action: runDoctor,
	}
}

// probeFlags are sweep's socket flags without --container, which
// reconcileFlags defines with another meaning.
func probeFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range socketFlags() {
		switch f.Names()[0] {
		case flagContainer, flagContainerPID:
			continue
		}
		out = append(out, f)
	}
	return out
}

// probeConfig builds the socket probing settings every command with
// probeFlags shares; sweepConfig adds the container to look into.
func probeConfig(c *cli.Context, g globals) (sockets.Config, error) {
	cfg := sockets.Config{
		Dirs:            c.StringSlice(flagSocketDir),
		SupervisorComms: g.SupervisorComms,
		Timeout:         c.Duration(flagTimeout),
		Workers:         c.Int(flagWorkers),
	}
	if cfg.Timeout <= 0 {
		return cfg, usageErr("--timeout must be positive")
	}
	if cfg.Workers <= 0 {
		return cfg, usageErr("--workers must be positive")
	}
	if err := checkSocketDirs(c); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// confHooksDirs returns containers.conf's hooks_dir (podman's own
// defaults included), or nil when the configuration cannot be read.
func confHooksDirs(log *slog.Logger) []string {
	cfg, err := config.New(nil)
	if err != nil {
		log.Warn("cannot read containers.conf; looking in the default hooks dirs only", "err", err)
		return nil
	}
	return cfg.Engine.HooksDir.Get()
}

func runDoctor(c *cli.Context) error {
	g, opt, err := loadScanSettings(c)
	if err != nil {
		return err
	}
	threshold, err := cull.ParseIdle(c.String(flagIdle))
	if err != nil {
		return usageErr("--idle: %v", err)
	}
	scfg, err := probeConfig(c, g)
	if err != nil {
		return err
	}
	for _, d := range c.StringSlice(flagHooksDir) {
		if !filepath.IsAbs(d) {
			return usageErr("--hooks-dir must be an absolute path, not %q", d)
		}
	}
	log, closeLog, err := newLogger(g.reporting(), g.LogFile)
	if err != nil {
		return err
	}
	defer closeLog()
	log = log.With("cmd", "doctor")
	fix := c.Bool("fix")

	rep := runChecks(c.Context, c, g, checkConfig{
		reconcile: opt, fix: fix, threshold: threshold, sockets: scfg,
		hooksDirs: doctor.HooksDirs(c.StringSlice(flagHooksDir), confHooksDirsUnless(c, log)),
	}, log, metricsOf(c))

	if g.JSON {
		err = rep.WriteJSON(c.App.Writer)
	} else {
		err = rep.WriteText(c.App.Writer)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	if rep.Worst != doctor.OK {
		return cli.Exit("", int(rep.Worst))
	}
	return nil
}

// confHooksDirsUnless reads containers.conf only when --hooks-dir is not
// given (it replaces every other directory).
func confHooksDirsUnless(c *cli.Context, log *slog.Logger) []string {
	if len(c.StringSlice(flagHooksDir)) > 0 {
		return nil
	}
	return confHooksDirs(log)
}

type checkConfig struct {
	reconcile reconcile.Options
	fix       bool
	threshold int64
	sockets   sockets.Config
	hooksDirs []string
}

// runChecks runs every check in report order and records them in ms.
func runChecks(ctx context.Context, c *cli.Context, g globals, cc checkConfig, log *slog.Logger, ms *metrics.Set) doctor.Report {
	rep := doctor.Report{Fix: cc.fix}

	// Podman runs hooks as the user it runs as, this janitor's: the hook's
	// own default state dir is the one for this host UID.
	hostUID := userns.HostEUID()
	hookDefault := ledger.DefaultDir(hostUID)
	// Orphaned trees, exactly as reconcile sees (and with --fix, reaps)
	// them, through reconcile's own scan-then-ask path. It goes first: the
	// engines are asked again below for their own checks, and a tree born
	// while they answer must not be scanned before an answer older than it.
	opt := cc.reconcile
	opt.Apply = cc.fix
	opt.Logger = log
	rj, _, liveErr, scanErr := scanThenAsk(ctx, c, g, opt, cc.fix, log)
	ein := engineInputs(ctx, c, g, log)
	// Whether podman is an engine here decides what a missing hook means.
	installed, descs := doctor.HookInstalled(cc.hooksDirs, g.StateDir, hookDefault)
	if !podmanAsked(ein) {
		installed = doctor.HookWithoutPodman(installed, descs)
	}
	rep.Add(installed)
	boot, err := doctor.BootTime(fingerprint.DefaultRoot)
	if err != nil {
		log.Warn("boot time unknown; counting every hook run", "err", err)
	}
	hookState, hookLog := doctor.HookStateDir(descs, hookDefault)
	rep.Add(doctor.HookAlive(doctor.AliveInput{StateDir: hookState, LogFile: hookLog, Boot: boot, LiveContainers: podmanLive(ein),
		HostUID: hostUID, TraceFiles: ledger.TraceFiles(hostUID)}))
	summary, perEngine, engines := doctor.Engines(ein)
	rep.Add(summary)
	for _, ch := range perEngine {
		rep.Add(ch)
	}
	rep.EngineMode, rep.Engines = "named", engines
	if g.Engines == nil {
		rep.EngineMode = "auto"
	}
	rep.Add(doctor.StateDir(g.StateDir))
	rep.Add(doctor.Listing(cc.reconcile.Lister))

	in := doctor.StraysInput{LivenessErr: liveErr, Fix: cc.fix}
	switch {
	case liveErr != nil:
		recordReconcile(ms, "doctor", reconcile.Report{}, false)
		rep.Add(doctor.Strays(in))
	case scanErr != nil:
		rep.Add(doctor.ScanFailed(scanErr))
	default:
		in.Report = rj.Report
		recordReconcile(ms, "doctor", rj.Report, true)
		rep.Add(doctor.Strays(in))
	}

	// Sockets (a dry-run sweep) and the sessions of the live ones.
	scfg := cc.sockets
	scfg.Apply = false
	srep, serr := sockets.Sweep(ctx, scfg)
	rep.Add(doctor.Sockets(srep, serr))
	var sups []cull.Supervisor
	if serr == nil {
		recordSweep(ms, srep)
		sups = cull.Audit(ctx, &kallichore.Client{Timeout: scfg.Timeout, RetryAfter: sockets.DefaultPause}, cull.Sources(srep.Sockets, nil), cc.threshold, scfg.Workers)
		recordCull(ms, sups)
	}
	rep.Add(doctor.Sessions(sups, cc.threshold, serr))

	for _, ch := range rep.Checks {
		ms.Set(metrics.DoctorCheck, float64(ch.Verdict), ch.Name)
	}
	return rep
}

// since renders how long ago t was, for the text reports.
func since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	if d < 0 {
		d = 0
	}
	return humanSeconds(int64(d/time.Second)) + " ago"
}

// liveState names a container's state for the reports: its engine's raw
// state, "gone" when no engine lists it, "?" when an engine could not be
// asked.
func liveState(live liveness.Set, known bool, id string) string {
	switch {
	case !known:
		return "?"
	case id == "":
		return "-"
	}
	if s, ok := live.States[id]; ok {
		return s
	}
	return "gone"
}
