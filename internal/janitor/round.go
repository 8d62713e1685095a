package janitor

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Watch is what watch's rounds and its handling of container deaths need,
// resolved once.
type Watch struct {
	Settings
	// ReconcileOn and CullOn: the steps not left out (--no-reconcile,
	// --no-cull).
	ReconcileOn, CullOn bool
	// Events follows the engines' container deaths between rounds.
	Events bool
	// Pidfd follows the deaths of live containers' inits through pidfds
	// (DESIGN "Engines"), handled as the engines' death events are.
	Pidfd       bool
	Interval    time.Duration
	MetricsFile string
	// Live, when set, is kept current for --metrics-listen.
	Live *Live
	// SocketTargets, when set, are the containers whose socket dirs sweep
	// and cull look into instead of the host's (watch --container): asked
	// every round, since a restarted container has a new init. With an
	// error it returns the targets it could resolve: those are swept, and
	// the round fails.
	SocketTargets func(context.Context) ([]sweep.Target, error)
	// moreMetrics adds the death events' counts to a round's metrics.
	moreMetrics func(*metrics.Set)
	// serial, when set, is held by a round's reconcile step and by each
	// attempt at a death: never two reaps at once. Sweep and cull run
	// outside it: anyone can make a sweep slow (a socket that never
	// answers), and a death must not wait for that.
	serial *sync.Mutex
}

// Once runs one round.
func (w *Watch) Once(ctx context.Context, log *slog.Logger) int {
	return w.round(ctx, log)
}

// Run runs a round now and then every Interval, following container
// deaths in between when Events is set, until stopping is closed; ctx
// ending abandons the round (or the death) being handled. It fails only
// when the engines to follow cannot be built.
func (w *Watch) Run(ctx context.Context, stopping <-chan struct{}, log *slog.Logger) error {
	w.serial = &sync.Mutex{}
	if w.Engines == nil && w.Engine.Found == nil {
		// Every question of this watch (rounds, deaths, pins, event
		// streams) asks each engine auto found once, for as long as it
		// runs.
		w.Engine.Found = engine.NewFound()
	}
	if w.Reconcile.Lister != proctable.ListProc && w.Reconcile.Program == nil {
		// One load of the iterator program for every decision: at a
		// death, the BTF read and the verifier would be most of a small
		// host's scan.
		if p, err := taskiter.Load(); err == nil {
			w.Reconcile.Program = p
			defer p.Close()
		} else {
			log.Debug("task iterator not loaded once; each scan tries its own", "err", err)
		}
	}
	round := func(ctx context.Context) int { return w.round(ctx, log) }
	stopEvents := func() {}
	if w.Events || w.Pidfd {
		var err error
		if stopEvents, w.moreMetrics, err = startDeathEvents(ctx, w, w.serial, log); err != nil {
			return err
		}
	}
	log.Info("watching", "interval", w.Interval, "reconcile", w.ReconcileOn, "events", w.Events, "pidfd", w.Pidfd, "reconcile_apply", w.Reconcile.Apply,
		"sweep_apply", w.Sockets.Apply, "cull", w.CullOn)
	loop(ctx, stopping, w.Interval, round, log)
	stopEvents() // waits for a death being handled, as for a round
	log.Info("stopped")
	return nil
}

// loop runs round now and then every interval (measured from the start of
// the previous round; a round longer than interval is followed by the
// next at once) until stopping is closed. A round's outcome never ends the
// loop. No round starts once stopping is closed: a signal taken while
// watch was starting (its task iterator, its event streams) stops it
// before a first round, which could reap and sweep for a minute.
func loop(ctx context.Context, stopping <-chan struct{}, interval time.Duration, round func(context.Context) int, log *slog.Logger) {
	for n := 1; ; n++ {
		select {
		case <-stopping:
			return
		default:
		}
		start := time.Now()
		code := round(ctx)
		if code != ExitOK {
			log.Warn("round failed; the next one runs on time", "round", n, "exit", code)
		}
		t := time.NewTimer(untilNext(start, time.Now(), interval))
		select {
		case <-stopping:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// untilNext is the wait before the next round: rounds start interval
// apart, measured from the previous start; a round longer than interval
// is followed at once.
func untilNext(start, now time.Time, interval time.Duration) time.Duration {
	return max(start.Add(interval).Sub(now), 0)
}

// round runs reconcile, sweep and cull once and returns the worst exit
// code of the three. Each step is guarded: a crash inside one is logged
// as its failure.
func (w *Watch) round(ctx context.Context, log *slog.Logger) int {
	start := time.Now()
	var ms *metrics.Set
	if w.MetricsFile != "" {
		ms = metrics.New()
	}
	worst := ExitOK
	note := func(code int) { // 3 (ground truth unknown) > 1 > 0
		if code > worst {
			worst = code
		}
	}

	var liveControls []cull.Source
	var swept []*sweep.Report
	// Set by the sweep once it looked: one that crashed (step recovers
	// it) looked at nothing.
	looked := false
	if w.ReconcileOn {
		note(step(log, ms, "reconcile", func() int { return w.reconcile(ctx, log, ms) }))
	}
	note(step(log, ms, "sweep", func() int {
		code, srcs, reps, ok := w.sweep(ctx, log, ms)
		liveControls, swept, looked = srcs, reps, ok
		return code
	}))
	// A sweep that could not look found no supervisors to audit: an
	// audit of none would record a clean one.
	switch {
	case w.CullOn && looked:
		note(step(log, ms, "cull", func() int { return w.cull(ctx, log, ms, liveControls) }))
	case w.CullOn:
		now := time.Now()
		ms.Run("cull", now, now, false)
	}
	if !looked {
		// Nothing looked at, or the sweep crashed before it could say
		// so: the last counts are not current.
		DropSweepAndCull(ms)
	}
	for _, rep := range swept {
		rep.Close()
	}
	if w.moreMetrics != nil {
		w.moreMetrics(ms)
	}
	end := time.Now()
	ms.Run("watch", start, end, worst == ExitOK)
	if ms != nil {
		if err := metrics.WriteFile(w.MetricsFile, ms); err != nil {
			log.Error("cannot write metrics", "file", w.MetricsFile, "err", err)
			note(ExitFailed)
		}
	}
	w.Live.round(start, end, worst)
	return worst
}

// step runs one step, turning a panic into a failure, and records its run.
func step(log *slog.Logger, ms *metrics.Set, name string, f func() int) (code int) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			log.Error("step crashed", "step", name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			code = ExitFailed
		}
		ms.Run(name, start, time.Now(), code == ExitOK)
	}()
	return f()
}

func (w *Watch) reconcile(ctx context.Context, log *slog.Logger, ms *metrics.Set) int {
	if w.serial != nil {
		w.serial.Lock()
		defer w.serial.Unlock()
	}
	rep, liveErr, err := Reconcile(ctx, w.Settings, log.With("step", "reconcile"))
	w.Live.reconciled(rep)
	if liveErr != nil {
		RecordReconcile(ms, "watch", rep.Report, false)
		return ExitUnknown // Reconcile logged it; nothing was touched
	}
	if err != nil {
		log.Error("reconcile failed", "err", err)
		return ExitFailed
	}
	RecordReconcile(ms, "watch", rep.Report, true)
	LogReconcile(ctx, log.With("step", "reconcile"), rep.Report)
	if rep.Failed() {
		return ExitFailed
	}
	return ExitOK
}

// sweep sweeps every target and returns the live control sockets for
// cull, with the reports whose directories they are pinned through (see
// sweep.Socket.Pin): the caller closes them once the audit is done.
// looked is false when the targets could not be found or none could be
// swept (round then drops the sweep's and cull's last counts).
func (w *Watch) sweep(ctx context.Context, log *slog.Logger, ms *metrics.Set) (code int, live []cull.Source, reps []*sweep.Report, looked bool) {
	targets := []sweep.Target{w.Sockets.Target}
	code = ExitOK
	if w.SocketTargets != nil {
		var err error
		targets, err = w.SocketTargets(ctx)
		switch {
		case err != nil && len(targets) == 0:
			log.Error("cannot look into the container; sweep and cull skipped", "step", "sweep", "err", err)
			return ExitFailed, nil, nil, false
		case err != nil:
			// One stopped container does not keep the others' sockets
			// from their sweep; the round still fails.
			log.Error("cannot look into some of the containers; the others are swept", "step", "sweep", "err", err)
			code = ExitFailed
		}
	}
	// One listing of the host's PID namespaces for every container of
	// the round, not a walk of /proc each (sweep.NSIndex).
	idx := sweep.NewNSIndex()
	for _, t := range targets {
		c, srcs, rep := w.sweepOne(ctx, log, t, idx)
		code = max(code, c)
		live = append(live, srcs...)
		if rep != nil {
			reps = append(reps, rep)
		}
	}
	if len(targets) > 0 && len(reps) == 0 {
		// Not one target could be swept (a container stopped meanwhile):
		// as if none could be found.
		return code, nil, nil, false
	}
	RecordSweep(ms, reps...)
	return code, live, reps, true
}

func (w *Watch) sweepOne(ctx context.Context, log *slog.Logger, t sweep.Target, idx *sweep.NSIndex) (int, []cull.Source, *sweep.Report) {
	cfg := w.Sockets
	cfg.Target, cfg.Namespaces = t, idx
	cfg.KeepDirs = w.CullOn
	cfg.Logger = log.With("step", "sweep")
	if t.Container() {
		cfg.Logger = cfg.Logger.With("container_pid", t.InitPID)
	}
	rep, err := sweep.Sweep(ctx, cfg)
	if err != nil {
		log.Error("sweep failed", "err", err)
		return ExitFailed, nil, nil
	}
	w.Live.swept(rep)
	live := cull.Sources(rep.Sockets, nil)
	for _, e := range rep.DirErrors {
		log.Error("socket directory", "step", "sweep", "err", e)
	}
	rep.Log(cfg.Logger)
	if rep.Failed() || len(rep.DirErrors) > 0 {
		return ExitFailed, live, rep
	}
	return ExitOK, live, rep
}

func (w *Watch) cull(ctx context.Context, log *slog.Logger, ms *metrics.Set, sources []cull.Source) int {
	sups := Audit(ctx, w.Sockets, sources, w.Threshold)
	RecordCull(ms, sups)
	if failed, _ := cull.Log(log.With("step", "cull"), w.Threshold, sups); failed {
		return ExitFailed
	}
	return ExitOK
}

// Audit reads the sessions of the supervisors on sources (cull's audit,
// for cull, watch and doctor) with cfg's timeout, workers and budget of
// bytes in flight (shared with the sweeps given the same cfg), all of it
// within cfg's deadline, as a sweep's probes are.
func Audit(ctx context.Context, cfg sweep.Config, sources []cull.Source, threshold int64) []cull.Supervisor {
	if cfg.Budget == nil {
		cfg.Budget = kallichore.NewBudget(0)
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = sweep.DefaultDeadline
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Deadline, fmt.Errorf("the audit's deadline (%s) passed", cfg.Deadline))
	defer cancel()
	client := &kallichore.Client{Timeout: cfg.Timeout, RetryAfter: sweep.DefaultPause, Budget: cfg.Budget}
	return cull.Audit(ctx, client, sources, threshold, cfg.Workers)
}
