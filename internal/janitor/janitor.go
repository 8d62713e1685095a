// Package janitor is the work behind kc-janitor's commands: the one
// reconcile pass (ScanThenAsk: no tree is acted on by an answer older
// than the scan, but a death's), the round (reconcile, then sweep, then
// cull) watch repeats, the handling of container deaths between rounds,
// doctor's run of its checks and status's view. It takes settings already
// resolved from the flags; turning flags into settings, exit codes and the
// help text stay in cmd/kc-janitor.
package janitor

import (
	"context"
	"log/slog"
	"slices"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Exit codes a pass reports (DESIGN "The outside"); a round's is the worst of its
// steps', 3 counting as worse than 1.
const (
	ExitOK      = 0
	ExitFailed  = 1
	ExitUnknown = 3
)

// Settings are what every pass needs, resolved from the flags once.
type Settings struct {
	// Engines are the engines --engine names; nil for auto.
	Engines []string
	// Engine holds every engine's endpoint and timeout; each question
	// sets its own Logger.
	Engine   engine.Config
	StateDir string
	// Reconcile are the scan and decision settings; Apply says whether
	// strays are reaped.
	Reconcile reconcile.Options
	// Sockets are the probing settings of sweep, cull and the socket
	// views; Apply says whether stale sockets are unlinked.
	Sockets sweep.Config
	// Threshold is cull's idle time in seconds.
	Threshold int64
	// onTruth, when set, is told every answer the engines give a
	// decision (watch's pins follow them).
	onTruth func(engine.Truth)
	// before, when set, gives the engines' latest answer to one of
	// watch's decisions, if there was one: a decision on deaths then
	// asks them about its containers alone (askNarrow).
	before func() (engine.Truth, bool)
	// scan, when set, stands in for reconcile.Scan (tests fail it while
	// the engines are being asked).
	scan func(reconcile.Options) (*reconcile.Scanned, error)
}

// Select builds the engines to ask. The error wraps engine.ErrUsage when
// --engine or an endpoint is malformed.
func (s Settings) Select(log *slog.Logger) ([]engine.Engine, error) {
	cfg := s.Engine
	cfg.Logger = log
	return engine.Select(s.Engines, cfg)
}

// Ask asks every selected engine which containers are alive. The error
// wraps engine.ErrUnknown when the truth is unknown, engine.ErrUsage
// when --engine or an endpoint is malformed.
func (s Settings) Ask(ctx context.Context, log *slog.Logger) (engine.Truth, error) {
	es, err := s.Select(log)
	if err != nil {
		return engine.Truth{}, err
	}
	tr, err := engine.Ask(ctx, es)
	return logAnswers(log, tr, err)
}

// AskAbout asks the engines again about ids, before being their first
// answer (engine.AskAbout). An engine found since is asked for its whole
// list.
func (s Settings) AskAbout(ctx context.Context, ids []string, before engine.Truth, log *slog.Logger) (engine.Truth, error) {
	es, err := s.Select(log)
	if err != nil {
		return engine.Truth{}, err
	}
	tr, err := engine.AskAbout(ctx, es, ids, before)
	return logAnswers(log, tr, err)
}

// askNarrow asks the engines about ids alone, checked against before,
// an earlier answer of theirs (engine.AskAbout: a container it listed
// must be in the new answer, or the whole list is asked). podman syncs
// the state of each container it lists, taking its lock, so on a host
// of a hundred containers a whole list costs a death some 100 ms; a
// narrowed one waits only for the dead container's. An engine before
// names that is not found now (auto mode, its socket gone) makes it a
// question for the whole lists, as a round's is.
func (s Settings) askNarrow(ctx context.Context, ids []string, before engine.Truth, log *slog.Logger) (engine.Truth, error) {
	es, err := s.Select(log)
	if err != nil {
		return engine.Truth{}, err
	}
	found := make(map[string]bool, len(es))
	for _, e := range es {
		found[e.Name()] = true
	}
	var tr engine.Truth
	if slices.ContainsFunc(before.Answers, func(a engine.Answer) bool { return !found[a.Engine] }) {
		tr, err = engine.Ask(ctx, es)
	} else {
		tr, err = engine.AskAbout(ctx, es, ids, before)
	}
	return logAnswers(log, tr, err)
}

// logAnswers logs each engine's answer in tr at debug level.
func logAnswers(log *slog.Logger, tr engine.Truth, err error) (engine.Truth, error) {
	for _, st := range tr.Statuses {
		if st.Error == nil {
			log.Debug("engine answered", "engine", st.Name, "endpoint", st.Endpoint, "source", st.Source, "uid", st.UID, "containers", st.Containers, "live", st.Live)
		}
	}
	return tr, err
}
