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

// logAnswers logs each engine's answer in tr at debug level.
func logAnswers(log *slog.Logger, tr engine.Truth, err error) (engine.Truth, error) {
	for _, st := range tr.Statuses {
		if st.Error == nil {
			log.Debug("engine answered", "engine", st.Name, "endpoint", st.Endpoint, "source", st.Source, "uid", st.UID, "containers", st.Containers, "live", st.Live)
		}
	}
	return tr, err
}
