package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/liveness"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

func reconcileCommand() *cli.Command {
	return &cli.Command{
		Name:  "reconcile",
		Usage: "find supervisor trees whose container is gone (podman is the ground truth) and, with --apply, reap them",
		Description: `A tree is a stray when podman does not list its container as live
(created, configured, initialized, running, paused or stopping), its age
is known and above --min-age, its group is not led by a foreign process,
and its processes belong to the UID whose podman was asked.

Without --apply nothing is signalled: the strays are listed as would-reap.
If podman cannot be asked (API down and no working CLI), nothing at all is
done and the exit code is 3.

Examples:
   kc-janitor reconcile                      # dry run
   kc-janitor reconcile --format json
   kc-janitor reconcile --apply --kill-grace 10s`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "apply", Usage: "reap the strays", DefaultText: "dry run", EnvVars: []string{"KC_APPLY"}},
		}, reconcileFlags()...),
		Action: runReconcile,
	}
}

// reconcileFlags are shared by reconcile, doctor and watch.
func reconcileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "min-age", Value: 90 * time.Second, Usage: "leave trees younger than this alone", EnvVars: []string{"KC_MIN_AGE"}},
		&cli.DurationFlag{Name: "kill-grace", Value: 5 * time.Second, Usage: "wait between SIGTERM and SIGKILL", EnvVars: []string{"KC_KILL_GRACE"}},
		&cli.StringSliceFlag{Name: "container", Usage: "only consider trees of this container, repeatable: a full 64-hex `ID` (taken as is: its container may be gone), or a unique ID prefix or name the engines resolve", EnvVars: []string{"KC_RECONCILE_CONTAINERS"}},
		&cli.BoolFlag{Name: "full-scan", Usage: "read every process, also reporting foreign groups (slower)", EnvVars: []string{"KC_FULL_SCAN"}},
		&cli.StringFlag{Name: "bpf", Value: "auto", Usage: "list processes through a BPF task iterator, `MODE` auto (where the kernel allows it, else /proc), on (fail without it) or off (never load a BPF program); --full-scan reads /proc regardless", EnvVars: []string{"KC_BPF"}},
	}
}

func runReconcile(c *cli.Context) error {
	g, opt, err := loadScanSettings(c)
	if err != nil {
		return err
	}
	log, closeLog, err := newLogger(g.reporting(), g.LogFile)
	if err != nil {
		return err
	}
	defer closeLog()
	log = log.With("cmd", "reconcile")
	opt.Apply = c.Bool("apply")
	opt.Logger = log

	rep, liveErr, err := reconcileOnce(c.Context, c, g, opt, log)
	if err == nil {
		recordReconcile(metricsOf(c), "reconcile", rep.Report, liveErr == nil)
	}
	if liveErr != nil {
		if g.JSON {
			writeJSON(c.App.Writer, rep)
		} else {
			msg := liveErr.Error()
			if !errors.Is(liveErr, liveness.ErrUnknown) {
				msg = "ground truth unknown: " + msg
			}
			fmt.Fprintf(c.App.Writer, "%s\nnothing was touched.\n", msg)
		}
		return cli.Exit("", exitUnknown)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	logReconcile(c.Context, log, rep.Report)
	switch {
	case g.JSON:
		writeJSON(c.App.Writer, rep)
	case g.Quiet() && !rep.Failed() && rep.Count(action.WouldReap) == 0 && rep.Count(action.Reaped)+rep.Count(action.Gone) == 0:
		// Nothing to act on: a quiet run prints nothing.
	default:
		printReconcile(c.App.Writer, rep)
	}
	if rep.Failed() {
		return cli.Exit("", exitFailed)
	}
	return nil
}

// loadScanSettings reads the global flags and the scan and liveness
// settings that reconcile, status, doctor and watch share.
func loadScanSettings(c *cli.Context) (globals, reconcile.Options, error) {
	g, err := loadGlobals(c)
	if err != nil {
		return g, reconcile.Options{}, err
	}
	opt, err := reconcileOptions(c, g)
	return g, opt, err
}

func reconcileOptions(c *cli.Context, g globals) (reconcile.Options, error) {
	opt := reconcile.Options{
		Comms:     g.SupervisorComms,
		MinAge:    c.Duration("min-age"),
		KillGrace: c.Duration("kill-grace"),
		FullScan:  c.Bool("full-scan"),
	}
	lister, err := trees.ParseLister(c.String("bpf"))
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
	if err := checkPodmanURL(g); err != nil {
		return opt, err
	}
	if err := checkEngines(c, g); err != nil {
		return opt, err
	}
	// Only once every engine setting is known good: resolving a name asks
	// the engines.
	for _, ref := range c.StringSlice("container") {
		m, err := resolveContainer(c, g, ref, false)
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
	if err := liveness.CheckURL(g.PodmanURL); err != nil {
		return usageErr("--podman-url: %v", err)
	}
	return nil
}

// reconcileOnce scans, asks the engines, then decides and (with Apply)
// reaps. liveErr is set when the ground truth is unknown (the engines
// could not be asked, or local evidence contradicts them, DESIGN §13);
// then nothing was touched.
func reconcileOnce(ctx context.Context, c *cli.Context, g globals, opt reconcile.Options, log *slog.Logger) (rep reconcileJSON, liveErr, err error) {
	rep, _, liveErr, err = scanThenAsk(ctx, c, g, opt, true, log)
	return rep, liveErr, err
}

// scanThenAsk is the one way to a decision about trees (reconcile, watch
// and doctor --fix): scan first, then ask the engines, so a tree created
// after the answer is never judged against it. create lets the janitor
// make its state dir (0700) once the engines have answered, dry runs
// included, so the ledger's snapshots stay fresh in audit weeks (§8).
func scanThenAsk(ctx context.Context, c *cli.Context, g globals, opt reconcile.Options, create bool, log *slog.Logger) (rep reconcileJSON, live liveness.Set, liveErr, err error) {
	rep = reconcileJSON{Report: reconcile.Report{DryRun: !opt.Apply, Trees: []reconcile.Tree{}}, Engines: []engine.Status{}}
	// The scan only reads the ledger; nothing is created before the
	// engines have answered.
	opt.Store = openStore(g.StateDir, false, log)
	scanned, err := reconcile.Scan(opt)
	if err != nil {
		return rep, live, nil, err
	}
	tr, err := askEngines(ctx, c, g, log)
	if tr.Statuses != nil {
		rep.Engines = tr.Statuses
	}
	if err != nil {
		if !errors.Is(err, liveness.ErrUnknown) {
			return rep, live, nil, err
		}
		log.Error("ground truth unknown; nothing touched", "err", err)
		return rep, live, err, nil
	}
	live = tr.Set
	if create && opt.Store == nil {
		if s := openStore(g.StateDir, true, log); s != nil {
			scanned.UseStore(s)
		}
	}
	rep.Report, err = scanned.Run(ctx, live)
	if errors.Is(err, liveness.ErrUnknown) {
		log.Error("ground truth contradicted; nothing touched", "err", err)
		return rep, live, err, nil
	}
	return rep, live, nil, err
}

// reconcileJSON is reconcile's report with the engines that were asked
// (DESIGN §12): "source" stays the first engine's for compatibility.
type reconcileJSON struct {
	reconcile.Report
	Engines []engine.Status `json:"engines"`
}

// openStore opens the ledger, creating the state dir (0700) when create
// is set. Without a ledger reconcile
// still works from /proc alone.
func openStore(dir string, create bool, log *slog.Logger) *ledger.Store {
	var s *ledger.Store
	var err error
	if create {
		s, err = ledger.Open(dir)
	} else {
		s, err = ledger.OpenReadOnly(dir)
	}
	if err != nil {
		log.Debug("running without the ledger", "dir", dir, "err", err)
		return nil
	}
	return s
}

// logReconcile writes the run's audit record: one line per tree that would
// be reaped (the reaped ones are logged as they are reaped) or would not
// die, then one summary line, also when nothing was found.
func logReconcile(ctx context.Context, log *slog.Logger, rep reconcile.Report) {
	logTrees(ctx, log, rep)
	log.Info("reconcile", "source", rep.Source, "dry_run", rep.DryRun, "trees", len(rep.Trees),
		"would_reap", rep.Count(action.WouldReap), "reaped", rep.Count(action.Reaped)+rep.Count(action.Gone),
		"would_not_die", rep.Count(action.WouldNotDie), "ledger_collected", rep.LedgerCollected)
}

// logTrees writes one line per tree that would be reaped or would not die.
func logTrees(ctx context.Context, log *slog.Logger, rep reconcile.Report) {
	for _, t := range rep.Trees {
		if t.Action != action.WouldReap && t.Action != action.WouldNotDie {
			continue
		}
		var members []string
		for _, m := range t.Members {
			members = append(members, fmt.Sprintf("%s(%d)", m.Comm, m.PID))
		}
		lvl, msg := slog.LevelInfo, "[DRY-RUN] would reap stray tree"
		attrs := []any{"container", t.ContainerID, "pgid", t.PGID, "uid", t.UID,
			"age_seconds", t.AgeSeconds, "members", strings.Join(members, " "), "action", t.Action}
		if t.Action == action.WouldNotDie {
			lvl, msg = slog.LevelError, "stray tree would not die"
		}
		if t.Error != nil {
			attrs = append(attrs, "err", *t.Error)
		}
		log.Log(ctx, lvl, msg, attrs...)
	}
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func printReconcile(w io.Writer, rep reconcileJSON) {
	mode := "dry run"
	if !rep.DryRun {
		mode = "apply"
	}
	var truth []string
	for _, e := range rep.Engines {
		truth = append(truth, e.Name+" "+e.Source)
	}
	if len(truth) == 0 {
		truth = []string{rep.Source}
	}
	fmt.Fprintf(w, "ground truth: %s; mode: %s\n", strings.Join(truth, ", "), mode)
	if len(rep.Trees) == 0 {
		fmt.Fprintln(w, "no supervisor trees found")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tPGID\tUID\tAGE\tMEMBERS\tACTION")
	for _, t := range rep.Trees {
		cid := t.ContainerID
		if len(cid) > 12 {
			cid = cid[:12]
		}
		if cid == "" {
			cid = "-"
		}
		age := "?"
		if t.AgeSeconds >= 0 {
			age = (time.Duration(t.AgeSeconds) * time.Second).String()
		}
		var ms []string
		for _, m := range t.Members {
			ms = append(ms, fmt.Sprintf("%s(%d)", m.Comm, m.PID))
		}
		what := string(t.Action)
		if t.Error != nil {
			what += ": " + *t.Error
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", cid, t.PGID, t.UID, age, strings.Join(ms, " "), what)
	}
	tw.Flush()
	if n := rep.Count(action.WouldReap); n > 0 {
		fmt.Fprintf(w, "%d stray tree(s) would be reaped; run with --apply to reap them\n", n)
	}
}
