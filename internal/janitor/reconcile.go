package janitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/printable"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// Report is reconcile's report with the engines that were asked (DESIGN
// "Engines"): "source" stays the first engine's for compatibility.
type Report struct {
	reconcile.Report
	Engines []engine.Status `json:"engines"`
}

// ApplyLockWait is how long a run that reaps waits for another to finish
// deciding and signalling before it gives up (and reaps nothing).
const ApplyLockWait = time.Minute

// Reconcile scans, asks the engines, then decides and (with
// s.Reconcile.Apply) reaps. liveErr is set when the ground truth is
// unknown (the engines could not be asked, or local evidence contradicts
// them, DESIGN "Ground truth must be corroborated"); then nothing was touched.
func Reconcile(ctx context.Context, s Settings, log *slog.Logger) (rep Report, liveErr, err error) {
	rep, _, liveErr, err = ScanThenAsk(ctx, s, true, log)
	return rep, liveErr, err
}

// firstAnswer is the question asked beside the scan: the engines' whole
// lists, or, for a decision on deaths where watch holds an earlier
// answer, a question about the dead containers alone. Such a decision
// is scoped to them (deathsOnly), so what the answer says of the others,
// as old as the earlier one, decides nothing.
func (s Settings) firstAnswer(ctx context.Context, opt reconcile.Options, log *slog.Logger) (engine.Truth, error) {
	if s.before != nil && deathsOnly(opt) {
		if before, ok := s.before(); ok {
			return s.askNarrow(ctx, slices.Sorted(maps.Keys(opt.Containers)), before, log)
		}
	}
	return s.Ask(ctx, log)
}

// ErrStateDir marks a run's failure, after the scan, to lock or open its
// state dir: an --apply run then reaps nothing.
var ErrStateDir = errors.New("state dir unusable")

// ScanThenAsk is the one way to a decision about trees (reconcile, watch
// and doctor --fix). The engines are asked while the host is scanned. A
// decision on deaths takes that answer as it is: a tree born after the
// death is spared whatever it says. Any other run takes it only if it
// calls every tree the scan found live (nothing to act on, a healthy
// host's usual run); else the engines are asked again once the scan is
// over, about the containers it left in doubt (engine.AskAbout), so that
// no tree is acted on by an answer older than what the scan read of it.
// create lets the janitor make its state dir (0700) once the
// engines have answered, dry runs included, so the ledger's snapshots
// stay fresh in audit weeks (DESIGN "Ledger").
func ScanThenAsk(ctx context.Context, s Settings, create bool, log *slog.Logger) (rep Report, live engine.Set, liveErr, err error) {
	opt := s.Reconcile
	if !create {
		// A look (doctor without --fix) changes nothing, ledger included.
		opt.LedgerRetention, opt.Look = -1, true
	}
	rep = Report{Report: reconcile.Report{DryRun: !opt.Apply, Trees: []reconcile.Tree{}}, Engines: []engine.Status{}}
	// The scan only reads the ledger; nothing is created before the
	// engines have answered.
	// Said once a run: by the runs that would record, not by doctor's
	// look (its state-dir check says it) nor by each death in watch (its
	// rounds say it).
	loud := create && !deathsOnly(opt)
	var storeErr error
	if opt.Store, storeErr = openStore(s.StateDir, false); storeErr != nil {
		withoutLedger(log, s.StateDir, storeErr, loud)
	}
	if s.Engine.Found == nil {
		// Both questions ask what auto found for the first: an engine
		// gone by the second is asked there all the same, fails, and
		// the truth is unknown, its status saying why.
		s.Engine.Found = engine.NewFound()
	}
	askCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		tr    engine.Truth
		asked = make(chan struct{})
	)
	go func() {
		defer close(asked)
		tr, err = s.firstAnswer(askCtx, opt, log)
	}()
	scan := reconcile.Scan
	if s.scan != nil {
		scan = s.scan
	}
	scanned, scanErr := scan(opt)
	if scanErr != nil {
		cancel()
		<-asked
		return rep, live, nil, scanErr
	}
	<-asked
	var doubted []string
	if err == nil && !deathsOnly(opt) {
		doubted = scanned.Doubted(tr.Set)
	}
	if len(doubted) > 0 {
		log.Debug("the engines' answer leaves trees to act on; asking again now the scan is over", "containers", len(doubted))
		tr, err = s.AskAbout(ctx, doubted, tr, log)
	}
	if tr.Statuses != nil {
		rep.Engines = tr.Statuses
	}
	if err != nil {
		if !errors.Is(err, engine.ErrUnknown) {
			return rep, live, nil, err
		}
		log.Error("ground truth unknown; nothing touched", "err", err)
		return rep, live, err, nil
	}
	live = tr.Set
	s.nameDeadInits(ctx, opt, &live, tr.Answers, log)
	if s.onTruth != nil {
		s.onTruth(tr)
	}
	if opt.Apply {
		// Held for deciding and signalling only (a death in watch never
		// waits behind another run's scan or engine question); the trees a
		// run that held it before us reaped are dropped when deciding, so
		// no tree is reaped, or counted, twice. Taken only once the engines
		// answered: a run that touches nothing creates nothing.
		unlock, err := ledger.LockApply(ctx, s.StateDir, ApplyLockWait)
		if err != nil {
			return rep, live, nil, fmt.Errorf("nothing reaped: %w: %w", ErrStateDir, err)
		}
		defer unlock()
	}
	if create && opt.Store == nil {
		st, err := openStore(s.StateDir, true)
		if err != nil && storeErr == nil {
			withoutLedger(log, s.StateDir, err, loud)
		}
		if st == nil && opt.Apply {
			return rep, live, nil, fmt.Errorf("nothing reaped: %w: the ledger in %s cannot be opened, so no reap could be recorded", ErrStateDir, s.StateDir)
		}
		if st != nil {
			scanned.UseStore(st)
		}
	}
	rep.Report, err = scanned.Run(ctx, live)
	if errors.Is(err, engine.ErrUnknown) {
		log.Error("ground truth contradicted; nothing touched", "err", err)
		return rep, live, err, nil
	}
	return rep, live, nil, err
}

// openStore opens the ledger, creating the state dir (0700) when create
// is set. Without a ledger reconcile still works from /proc alone. A state
// dir that does not exist yet is no error: no hook has run here, and
// nothing is recorded to miss.
func openStore(dir string, create bool) (*ledger.Store, error) {
	var s *ledger.Store
	var err error
	if create {
		s, err = ledger.Open(dir)
	} else {
		s, err = ledger.OpenReadOnly(dir)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return s, err
}

// withoutLedger says that a run goes on without the ledger it cannot use:
// trees known only from their records (a kernel whose supervisor died)
// are not found, and nothing is recorded.
func withoutLedger(log *slog.Logger, dir string, err error, loud bool) {
	level := slog.LevelDebug
	if loud {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "running without the ledger: trees only its records name are not found", "dir", dir, "err", err)
}

// LogReconcile writes the run's audit record: one line per tree that
// would be reaped (the reaped ones are logged as they are reaped) or would
// not die, then one summary line, also when nothing was found.
func LogReconcile(ctx context.Context, log *slog.Logger, rep reconcile.Report) {
	logTrees(ctx, log, rep)
	if rep.Unrecorded != nil {
		log.Error("reaped without recording in the ledger: the audit trail of these kills is missing", "err", rep.Unrecorded)
	}
	attrs := []any{"source", rep.Source, "dry_run", rep.DryRun, "trees", len(rep.Trees),
		"would_reap", rep.Count(action.WouldReap), "reaped", rep.Count(action.Reaped) + rep.Count(action.Gone),
		"would_not_die", rep.Count(action.WouldNotDie), "ledger_collected", rep.LedgerCollected}
	// Why the other trees were spared, for an audit that reads the log
	// alone: only the reasons that occurred (skipped_young=2 …).
	for _, a := range action.Skips {
		if n := rep.Count(a); n > 0 {
			attrs = append(attrs, strings.ReplaceAll(string(a), "-", "_"), n)
		}
	}
	if n := len(rep.Cgroups); n > 0 {
		attrs = append(attrs, "cgroups", n)
	}
	log.Info("reconcile", attrs...)
}

// logTrees writes one line per tree (and cgroup) that would be reaped or
// would not die.
func logTrees(ctx context.Context, log *slog.Logger, rep reconcile.Report) {
	for _, c := range rep.Cgroups {
		if c.Outcome == action.WouldReap {
			log.Info("[DRY-RUN] would sweep the cgroup of a gone container", "container", c.ContainerID, "cgroup", c.Path, "action", c.Outcome)
		}
	}
	for _, t := range rep.Trees {
		if t.Action != action.WouldReap && t.Action != action.WouldNotDie {
			continue
		}
		lvl, msg := slog.LevelInfo, "[DRY-RUN] would reap stray tree"
		attrs := []any{"container", t.ContainerID}
		if t.Pod != "" {
			attrs = append(attrs, "pod", t.Pod)
		}
		attrs = append(attrs, "pgid", t.PGID, "uid", t.UID,
			"age_seconds", t.AgeSeconds, "members", logMembers(t), "action", t.Action)
		if t.Action == action.WouldNotDie {
			lvl, msg = slog.LevelError, "stray tree would not die"
		}
		if t.Error != nil {
			attrs = append(attrs, "err", *t.Error)
		}
		log.Log(ctx, lvl, msg, attrs...)
	}
}

// logMembers is a tree's members for its log line: the first few, but
// up to 256 of a tree that would not die, which the operator must deal
// with by hand from the log alone (anyone can keep thousands in a sleep
// no signal ends, on a FUSE mount of his own).
func logMembers(t reconcile.Tree) string {
	if t.Action == action.WouldNotDie {
		return reconcile.MembersText(t.Members, 256)
	}
	return reconcile.MembersText(t.Members, reconcile.ShownMembers)
}

// Text writes reconcile's text report.
func (rep Report) Text(w io.Writer) {
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
		rep.cgroupsText(w)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tPGID\tUID\tAGE\tMEMBERS\tACTION")
	for _, t := range rep.Trees {
		cid := short(t.ContainerID)
		age := "?"
		if t.AgeSeconds >= 0 {
			age = cull.HumanSeconds(t.AgeSeconds)
		}
		what := string(t.Action)
		if t.Error != nil {
			what += ": " + printable.Quote(*t.Error)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", cid, t.PGID, t.UID, age, reconcile.MembersText(t.Members, reconcile.ShownMembers), what)
	}
	tw.Flush()
	rep.cgroupsText(w)
	if rep.Unrecorded != nil {
		fmt.Fprintf(w, "reaped, but not recorded in the ledger: %s\n", printable.Quote(rep.Unrecorded.Error()))
	}
	switch n := rep.Count(action.WouldReap); {
	case rep.Refused != "":
		fmt.Fprintf(w, "nothing was reaped: %s\n", rep.Refused)
	case rep.WouldRefuse != "":
		fmt.Fprintf(w, "%d stray tree(s) found, but an --apply run would reap nothing: %s\n", n, rep.WouldRefuse)
	case n > 0:
		fmt.Fprintf(w, "%d stray tree(s) would be reaped; run with --apply to reap them\n", n)
	}
}

// cgroupsText writes a line per supervisor cgroup swept, or that would be.
func (rep Report) cgroupsText(w io.Writer) {
	for _, c := range rep.Cgroups {
		line := fmt.Sprintf("cgroup %s of a gone container: %s", printable.Quote(c.Path), c.Outcome)
		if len(c.Withheld) > 0 {
			line += fmt.Sprintf(", %d process(es) withheld", len(c.Withheld))
		}
		if c.Error != "" {
			line += ": " + printable.Quote(c.Error)
		}
		fmt.Fprintln(w, line)
	}
}

// nameDeadInits asks the engines that list no init PIDs (Docker: one
// inspect each) about each container whose init the kernel saw exit and
// which their list still calls live, so that reconcile can tell an
// engine behind the kernel from a restarted container (DESIGN "Engines").
// dockerd's list lags its inspect: an inspect that says the container
// is not running is the engine's own word, and the container is taken
// out of the live set. Only the few containers of a death's decision
// are asked, each of the engine whose own list called it live, and an
// answer counts only from a peer of the UID that list came from; one
// that fails leaves the container live.
func (s Settings) nameDeadInits(ctx context.Context, opt reconcile.Options, live *engine.Set, answers []engine.Answer, log *slog.Logger) {
	var ids []string
	for id, pid := range opt.InitExited {
		if pid > 0 && live.IsLive(id) && live.PIDs[id] == 0 {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	es, err := s.Select(log)
	if err != nil {
		return
	}
	pids, notRunning := maps.Clone(live.PIDs), map[string]bool{}
	if pids == nil {
		pids = map[string]int{}
	}
	for _, e := range es {
		if _, ok := e.(engine.InitPIDAsker); !ok {
			continue
		}
		i := slices.IndexFunc(answers, func(a engine.Answer) bool { return a.Engine == e.Name() && a.Endpoint == e.Endpoint() })
		if i < 0 {
			continue
		}
		a := answers[i]
		var its []string
		for _, id := range ids {
			if slices.ContainsFunc(a.Containers, func(c engine.Container) bool { return c.ID == id && c.Live }) {
				its = append(its, id)
			}
		}
		for id, pid := range askInitPIDs(ctx, es, listedIn(a), its, s.Engine.Timeout, log) {
			if pid > 0 {
				pids[id] = pid
			} else {
				notRunning[id] = true
			}
		}
	}
	live.PIDs = pids
	if len(notRunning) == 0 {
		return
	}
	live.Live = maps.Clone(live.Live)
	for id := range notRunning {
		// Another engine may still list it running (a container both
		// dockerd and containerd's moby namespace know): only a PID
		// from one of them would have kept it.
		if pids[id] == 0 {
			delete(live.Live, id)
			log.Info("the engine's list still calls the container live, its inspect does not: taken as gone", "container", id, "init_pid", opt.InitExited[id])
		}
	}
}

// deathsOnly: the run decides on deaths alone, every container in its
// scope with its time of death (watch's death handling), so that a tree
// born after the death is spared whatever the engines answer.
func deathsOnly(opt reconcile.Options) bool {
	if len(opt.Containers) == 0 {
		return false
	}
	for id := range opt.Containers {
		if _, ok := opt.DiedAtByID[id]; !ok && opt.DiedAt.IsZero() {
			return false
		}
	}
	return true
}
