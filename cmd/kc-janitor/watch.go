package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

func watchCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.DurationFlag{Name: "interval", Value: 15 * time.Minute, Usage: "time between the starts of two rounds", EnvVars: []string{"KC_WATCH_INTERVAL"}},
		&cli.BoolFlag{Name: "reconcile-apply", Usage: "reap stray trees", DefaultText: "dry run", EnvVars: []string{"KC_RECONCILE_APPLY", "KC_APPLY"}},
		&cli.BoolFlag{Name: "sweep-apply", Usage: "unlink stale sockets", DefaultText: "dry run", EnvVars: []string{"KC_SWEEP", "KC_APPLY"}},
		&cli.BoolFlag{Name: "no-reconcile", Usage: "skip reconcile (where podman is not the container engine's ground truth, e.g. CRI-O nodes)", EnvVars: []string{"KC_WATCH_NO_RECONCILE"}},
		&cli.BoolFlag{Name: "no-cull", Usage: "skip the session audit", EnvVars: []string{"KC_WATCH_NO_CULL"}},
		&cli.BoolFlag{Name: "once", Usage: "run one round and exit with its worst exit code (for a systemd timer or cron)", EnvVars: []string{"KC_WATCH_ONCE"}},
		&cli.BoolFlag{Name: "no-events", Usage: "do not follow the engines' container deaths (Docker's die, podman's died, containerd's task exit): a dead container's trees then wait for the next round", EnvVars: []string{"KC_WATCH_NO_EVENTS"}},
		&cli.StringFlag{Name: flagIdle, Value: "24h", Usage: "cull: report sessions idle longer than `DURATION` (or seconds)", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
	}
	flags = append(flags, reconcileFlags()...)
	flags = append(flags, probeFlags()...)
	return &cli.Command{
		Name:  "watch",
		Usage: "run reconcile, sweep and cull every --interval (for a systemd service or a DaemonSet)",
		Description: `Each round runs reconcile, then sweep, then cull (--no-reconcile and
--no-cull leave a step out), with the same meaning
and flags as the single commands; reconcile and sweep are dry runs unless
--reconcile-apply / --sweep-apply (KC_APPLY=1 turns both on; cull never
kills). Every round logs one summary line per step; --metrics-file is
rewritten after every round.

Between rounds, watch follows the container deaths Docker (/events,
"die"), podman (its API service's libpod events, "died") and containerd
(/tasks/exit, /tasks/delete) report and reconciles the dead container's
trees at once, with the round's decision table: the engines are asked
again, --min-age and --container hold, and without --reconcile-apply the
stray is only logged as would-reap. A dropped event stream is subscribed
again with backoff (250ms up to 30s), then one reconcile catches up on
the deaths it missed. Without a podman API service, podman's deaths come
from "podman events" run as a child when the CLI reads the same store
(the default socket, or --podman-arg naming it); else there are none
and kc-hook's poststop, or the next round, does this job.
--no-events (or --no-reconcile) turns this off; --once never follows.

A round that fails (podman unreachable, an unreadable directory, a tree
that would not die, even a crash inside a step) is logged and the next
round runs on time. SIGTERM or SIGINT stop the loop after the current
round (a second signal abandons it) and the exit status is 0.

Examples:
   kc-janitor watch --interval 15m
   KC_APPLY=1 kc-janitor watch --interval 5m --metrics-file /var/lib/prometheus/node-exporter/kc-janitor.prom
   kc-janitor watch --once                    # one round, for a timer`,
		Flags:  flags,
		Action: runWatch,
	}
}

// watchConfig is everything a round needs, resolved once.
type watchConfig struct {
	g           globals
	reconcile   reconcile.Options
	sockets     sockets.Config
	sweepApply  bool
	reconcileOn bool
	cull        bool
	threshold   int64
	metricsFile string
	flags       *cli.Context // for queryLiveness's flags
	// moreMetrics adds the death events' counts to a round's metrics.
	moreMetrics func(*metrics.Set)
}

func runWatch(c *cli.Context) error {
	g, opt, err := loadScanSettings(c)
	if err != nil {
		return err
	}
	if g.JSON {
		// watch prints no report: what it finds is in its log lines.
		return usageErr("watch prints no report, only log lines: for JSON use --log-format json, not --format json")
	}
	scfg, err := probeConfig(c, g)
	if err != nil {
		return err
	}
	threshold, err := cull.ParseIdle(c.String(flagIdle))
	if err != nil {
		return usageErr("--idle: %v", err)
	}
	interval := c.Duration("interval")
	if interval <= 0 {
		return usageErr("--interval must be positive")
	}
	log, closeLog, err := newLogger(g, g.LogFile)
	if err != nil {
		return err
	}
	defer closeLog()
	log = log.With("cmd", "watch")
	opt.Apply = c.Bool("reconcile-apply")
	opt.Logger = log.With("step", "reconcile")
	wc := watchConfig{
		g: g, reconcile: opt, sockets: scfg, sweepApply: c.Bool("sweep-apply"), reconcileOn: !c.Bool("no-reconcile"), cull: !c.Bool("no-cull"),
		threshold: threshold, metricsFile: sharedString(c, flagMetricsFile), flags: c,
	}
	// Rounds and the handling of container deaths take turns: never two
	// reaps at once.
	var serial sync.Mutex
	round := func(ctx context.Context) int {
		serial.Lock()
		defer serial.Unlock()
		return watchRound(ctx, wc, log)
	}

	if c.Bool("once") {
		if code := round(c.Context); code != exitOK {
			return cli.Exit("", code)
		}
		return nil
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	stopping := make(chan struct{})
	roundCtx, cancelRound := context.WithCancel(c.Context)
	defer cancelRound()
	go func() {
		sig := <-sigs
		log.Info("stopping after the current round", "signal", sig.String())
		close(stopping)
		sig = <-sigs
		log.Warn("abandoning the current round", "signal", sig.String())
		cancelRound()
	}()
	events := wc.reconcileOn && !c.Bool("no-events")
	stopEvents := func() {}
	if events {
		var err error
		if stopEvents, wc.moreMetrics, err = startDeathEvents(roundCtx, wc, &serial, log); err != nil {
			return err
		}
	}
	log.Info("watching", "interval", interval, "reconcile", wc.reconcileOn, "events", events, "reconcile_apply", opt.Apply,
		"sweep_apply", wc.sweepApply, "cull", wc.cull)
	watchLoop(roundCtx, stopping, interval, round, log)
	stopEvents() // waits for a death being handled, as for a round
	log.Info("stopped")
	return nil
}

// watchLoop runs round now and then every interval (measured from the
// start of the previous round; a round longer than interval is followed by
// the next at once) until stopping is closed. A round's outcome never ends
// the loop.
func watchLoop(ctx context.Context, stopping <-chan struct{}, interval time.Duration, round func(context.Context) int, log *slog.Logger) {
	for n := 1; ; n++ {
		start := time.Now()
		code := round(ctx)
		if code != exitOK {
			log.Warn("round failed; the next one runs on time", "round", n, "exit", code)
		}
		select {
		case <-stopping:
			return
		default:
		}
		wait := time.Until(start.Add(interval))
		if wait < 0 {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-stopping:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchRound runs reconcile, sweep and cull once and returns the worst
// exit code of the three. Each step is guarded: a crash inside one is
// logged as its failure.
func watchRound(ctx context.Context, wc watchConfig, log *slog.Logger) int {
	start := time.Now()
	var ms *metrics.Set
	if wc.metricsFile != "" {
		ms = metrics.New()
	}
	worst := exitOK
	note := func(code int) { // 3 (ground truth unknown) > 1 > 0
		if code > worst {
			worst = code
		}
	}

	var liveControls []cull.Source
	if wc.reconcileOn {
		note(step(log, ms, "reconcile", func() int { return watchReconcile(ctx, wc, log, ms) }))
	}
	note(step(log, ms, "sweep", func() int {
		code, srcs := watchSweep(ctx, wc, log, ms)
		liveControls = srcs
		return code
	}))
	if wc.cull {
		note(step(log, ms, "cull", func() int { return watchCull(ctx, wc, log, ms, liveControls) }))
	}
	if wc.moreMetrics != nil {
		wc.moreMetrics(ms)
	}
	ms.Run("watch", start, time.Now(), worst == exitOK)
	if ms != nil {
		if err := metrics.WriteFile(wc.metricsFile, ms); err != nil {
			log.Error("cannot write metrics", "file", wc.metricsFile, "err", err)
			note(exitFailed)
		}
	}
	return worst
}

// step runs one step, turning a panic into a failure, and records its run.
func step(log *slog.Logger, ms *metrics.Set, name string, f func() int) (code int) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			log.Error("step crashed", "step", name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			code = exitFailed
		}
		ms.Run(name, start, time.Now(), code == exitOK)
	}()
	return f()
}

func watchReconcile(ctx context.Context, wc watchConfig, log *slog.Logger, ms *metrics.Set) int {
	rep, liveErr, err := reconcileOnce(ctx, wc.flags, wc.g, wc.reconcile, log.With("step", "reconcile"))
	if liveErr != nil {
		recordReconcile(ms, "watch", rep.Report, false)
		return exitUnknown // reconcileOnce logged it; nothing was touched
	}
	if err != nil {
		log.Error("reconcile failed", "err", err)
		return exitFailed
	}
	recordReconcile(ms, "watch", rep.Report, true)
	logReconcile(ctx, log.With("step", "reconcile"), rep.Report)
	if rep.Failed() {
		return exitFailed
	}
	return exitOK
}

func watchSweep(ctx context.Context, wc watchConfig, log *slog.Logger, ms *metrics.Set) (int, []cull.Source) {
	cfg := wc.sockets
	cfg.Apply = wc.sweepApply
	cfg.Logger = log.With("step", "sweep")
	rep, err := sockets.Sweep(ctx, cfg)
	if err != nil {
		log.Error("sweep failed", "err", err)
		return exitFailed, nil
	}
	recordSweep(ms, rep)
	live := cull.Sources(rep.Sockets, nil)
	for _, e := range rep.DirErrors {
		log.Error("socket directory", "step", "sweep", "err", e)
	}
	logSweep(cfg.Logger, rep)
	if rep.Failed() || len(rep.DirErrors) > 0 {
		return exitFailed, live
	}
	return exitOK, live
}

func watchCull(ctx context.Context, wc watchConfig, log *slog.Logger, ms *metrics.Set, sources []cull.Source) int {
	client := &kallichore.Client{Timeout: wc.sockets.Timeout, RetryAfter: sockets.DefaultPause}
	sups := cull.Audit(ctx, client, sources, wc.threshold, wc.sockets.Workers)
	recordCull(ms, sups)
	code := exitOK
	if failed, _ := logCull(log.With("step", "cull"), wc.threshold, sups); failed {
		code = exitFailed
	}
	return code
}
