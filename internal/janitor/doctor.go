package janitor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// Doctor runs every check of doctor in report order and records them in
// ms. Nothing is changed unless fix is set, and then only strays are
// reaped, through the one reconcile path (ScanThenAsk). hooksDirs are the hooks.d
// directories podman reads.
func Doctor(ctx context.Context, s Settings, fix bool, hooksDirs []string, log *slog.Logger, ms *metrics.Set) doctor.Report {
	rep := doctor.Report{Fix: fix}

	// Podman runs hooks as the user it runs as, this janitor's: the hook's
	// own default state dir is the one for this host UID.
	hostUID := userns.HostEUID()
	hookDefault := ledger.DefaultDir(hostUID)
	// Orphaned trees, exactly as reconcile sees (and with --fix, reaps)
	// them, through reconcile's own path, with its own answer: the
	// engines are asked again below for their own checks.
	fixing := s
	fixing.Reconcile.Apply = fix
	fixing.Reconcile.Logger = log
	var answers []engine.Answer
	fixing.onTruth = func(tr engine.Truth) { answers = tr.Answers }
	rj, _, liveErr, scanErr := ScanThenAsk(ctx, fixing, fix, log)
	ein := engineInputs(ctx, s, log)
	// Whether podman is an engine here decides what a missing hook means.
	installed, descs := doctor.HookInstalled(ctx, hooksDirs, s.StateDir, hookDefault)
	if !podmanAsked(ein) {
		installed = doctor.HookWithoutPodman(installed, descs)
	}
	installed = doctor.WithContainerdHandlers(installed, "", len(descs) == 0)
	installed = doctor.WithRootlessAllowlist(installed, descs, hostUID != 0, supervise.DefaultAllowlistFile)
	rep.Add(installed)
	boot, err := doctor.BootTime(fingerprint.DefaultRoot)
	if err != nil {
		log.Warn("boot time unknown; counting every hook run", "err", err)
	}
	hookState, hookLog := doctor.HookStateDir(descs, hookDefault)
	rep.Add(doctor.HookAlive(doctor.AliveInput{StateDir: hookState, LogFile: hookLog, Boot: boot, LiveContainers: podmanLive(ein),
		NoPodman: !podmanAsked(ein), HostUID: hostUID, TraceFiles: ledger.TraceFiles(hostUID)}))
	summary, perEngine, engines := doctor.Engines(ein)
	rep.Add(summary)
	for _, ch := range perEngine {
		rep.Add(ch)
	}
	rep.EngineMode, rep.Engines = "named", engines
	if s.Engines == nil {
		rep.EngineMode = "auto"
	}
	rep.Add(doctor.StateDir(s.StateDir))
	rep.Add(doctor.Listing(s.Reconcile.Lister))
	switch {
	case liveErr != nil:
		rep.Add(doctor.PidfdsUnknown("the engines could not be asked"))
	case scanErr != nil && !errors.Is(scanErr, ErrStateDir):
		rep.Add(doctor.PidfdsUnknown("the host could not be scanned"))
	default:
		rep.Add(doctor.Pidfds(pinnable(s, answers, func(by listedBy, ids []string) map[string]int {
			es, err := s.Select(log)
			if err != nil {
				return nil
			}
			return askInitPIDs(ctx, es, by, ids, s.Engine.Timeout, log)
		})))
	}
	rep.Add(doctor.Containment(contain.Detect(s.Reconcile.Contain)))

	// A look records its checks and whether the engines answered, not
	// the run gauges of what it looked at: in a file apply runs share,
	// those are theirs (a look resetting kc_janitor_strays_failed would
	// clear the alert on a tree that would not die). --fix reaps, and
	// records what it did.
	counts := ms
	if !fix {
		counts = nil
		ms.Bool(metrics.GroundTruthKnown, liveErr == nil, "doctor")
	}
	in := doctor.StraysInput{LivenessErr: liveErr, Fix: fix}
	switch {
	case liveErr != nil:
		RecordReconcile(counts, "doctor", reconcile.Report{}, false)
		rep.Add(doctor.Strays(in))
	case errors.Is(scanErr, ErrStateDir):
		rep.Add(doctor.StateDirFailed(scanErr))
	case scanErr != nil:
		rep.Add(doctor.ScanFailed(scanErr))
	default:
		in.Report = rj.Report
		RecordReconcile(counts, "doctor", rj.Report, true)
		rep.Add(doctor.Strays(in))
	}

	// Sockets (a dry-run sweep) and the sessions of the live ones: the
	// host's, unless the run is scoped to containers.
	if why := socketsOutOfScope(s); why != "" {
		rep.Add(doctor.Skipped(doctor.NameSockets, why))
		rep.Add(doctor.Skipped(doctor.NameSessions, why))
	} else {
		socketChecks(ctx, s, &rep)
	}

	// The whole family, every run: a check this run did not make (an
	// engine no longer asked) must not stay in the file at its old value.
	ms.Drop(metrics.DoctorCheck)
	for _, ch := range rep.Checks {
		ms.Set(metrics.DoctorCheck, float64(ch.Verdict), ch.Name)
	}
	return rep
}

// socketChecks sweeps the host's sockets, dry, and audits the sessions
// of the live ones. It records no gauges: those are the runs' that act
// (a dry sweep's "0 unlinked" would overwrite watch's in a shared file).
func socketChecks(ctx context.Context, s Settings, rep *doctor.Report) {
	scfg := s.Sockets
	scfg.Apply = false
	scfg.KeepDirs = true // the audit dials through them (Socket.Pin)
	srep, serr := sweep.Sweep(ctx, scfg)
	defer srep.Close()
	rep.Add(doctor.Sockets(srep, serr))
	var sups []cull.Supervisor
	if serr == nil {
		sups = Audit(ctx, scfg, cull.Sources(srep.Sockets, nil), s.Threshold)
	}
	rep.Add(doctor.Sessions(sups, s.Threshold, serr))
}

// engineInputs asks every engine --engine selects, and its version, for
// doctor's per-engine checks, and records what auto looked for. It is a
// question apart from the strays check's: the engines' own numbers (each
// answer's time, its version) are not in the union reconcile works from.
func engineInputs(ctx context.Context, s Settings, log *slog.Logger) doctor.EnginesInput {
	cfg := s.Engine
	cfg.Logger = log
	in := doctor.EnginesInput{Auto: s.Engines == nil, NotRoot: os.Geteuid() != 0}
	es, selErr := engine.Select(s.Engines, cfg)

	var tr engine.Truth
	versions := make([]string, len(es))
	versionErrs := make([]error, len(es))
	var wg sync.WaitGroup
	if selErr == nil && len(es) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, _ = engine.Ask(ctx, es) // each engine's error is in its Status
		}()
		for i, e := range es {
			wg.Add(1)
			go func() {
				defer wg.Done()
				versions[i], versionErrs[i] = engine.VersionOf(ctx, e)
			}()
		}
	}
	wg.Wait()

	statuses := map[string]engine.Status{}
	for _, st := range tr.Statuses {
		statuses[st.Name] = st
	}
	answers := map[string]engine.Answer{}
	for _, a := range tr.Answers {
		answers[a.Engine] = a
	}
	asked := map[string]int{}
	for i, e := range es {
		asked[e.Name()] = i
	}
	for _, d := range engine.Detect(cfg) {
		ei := doctor.EngineInput{Name: d.Name, Endpoint: d.Endpoint, Found: d.Found, Named: slices.Contains(s.Engines, d.Name)}
		i, ok := asked[d.Name]
		switch {
		case selErr != nil && (ei.Named || (in.Auto && d.Found)):
			ei.Asked, ei.Err = true, selErr
		case ok:
			ei.Asked = true
			st := statuses[d.Name]
			ei.Endpoint = st.Endpoint
			if st.Error != nil {
				ei.Err = errors.New(*st.Error)
				break
			}
			ei.Source, ei.UID, ei.Containers, ei.Live = st.Source, st.UID, st.Containers, st.Live
			ei.Took = answers[d.Name].Took
			ei.Version, ei.VersionErr = versions[i], versionErrs[i]
			if ei.VersionErr != nil {
				log.Debug("engine did not say its version", "engine", d.Name, "err", ei.VersionErr)
			}
		}
		in.Engines = append(in.Engines, ei)
	}
	return in
}

// podmanLive is how many containers podman lists as live, for the hook
// alive check (the hook is podman's: Docker's and containerd's containers
// say nothing about it); -1 when podman could not be asked, 0 when it is
// not asked here.
func podmanLive(in doctor.EnginesInput) int {
	for _, e := range in.Engines {
		if e.Name == doctor.NamePodman && e.Asked {
			if e.Err != nil {
				return -1
			}
			return e.Live
		}
	}
	return 0
}

// podmanAsked says whether podman is one of the engines asked here
// (named, or found by auto), answering or not.
func podmanAsked(in doctor.EnginesInput) bool {
	for _, e := range in.Engines {
		if e.Name == doctor.NamePodman && e.Asked {
			return true
		}
	}
	return false
}
