package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

const flagMetricsFile = "metrics-file"

// metricsFlags are given to the app and to every command, like the global
// flags.
func metricsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagMetricsFile, Usage: "write Prometheus metrics of this run to `FILE` (text format, replaced atomically, merged with the other commands' series) for node_exporter's textfile collector", EnvVars: []string{"KC_METRICS_FILE"}},
	}
}

type metricsKey struct{}

// metricsOf returns the run's metrics set; nil (which drops everything)
// when --metrics-file is not given.
func metricsOf(c *cli.Context) *metrics.Set {
	if c == nil || c.Context == nil {
		return nil
	}
	s, _ := c.Context.Value(metricsKey{}).(*metrics.Set)
	return s
}

// withMetrics wraps a command's action: with --metrics-file it gives the
// action a metrics set to fill, then records the run (time, duration,
// success) and writes the file. A file that cannot be written fails a run
// that had succeeded (exit 1): a monitoring that silently stopped is worse
// than a failed run.
func withMetrics(name string, action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		path := sharedString(c, flagMetricsFile)
		switch name {
		case "watch": // writes after every round itself
			return action(c)
		case "version", "man", "completion", "config-doc":
			return action(c)
		}
		if path == "" {
			return action(c)
		}
		s := metrics.New()
		c.Context = context.WithValue(c.Context, metricsKey{}, s)
		start := time.Now()
		err := action(c)
		ok := err == nil
		var ec cli.ExitCoder
		if errors.As(err, &ec) && ec.ExitCode() == 0 {
			ok = true
		}
		s.Run(name, start, time.Now(), ok)
		if werr := metrics.WriteFile(path, s); werr != nil {
			if err == nil || ok {
				return cli.Exit(fmt.Sprintf("metrics: %v", werr), exitFailed)
			}
			warnf(c, "metrics: %v", werr)
		}
		return err
	}
}

// recordReconcile records a reconcile report of command (reconcile,
// doctor, watch). known is false when the engines could not be asked (the
// report is then empty).
func recordReconcile(s *metrics.Set, command string, rep reconcile.Report, known bool) {
	if s == nil {
		return
	}
	s.Bool(metrics.GroundTruthKnown, known, command)
	if !known {
		// Nothing was looked at: the last counts are not current any
		// more, and are taken out rather than left to be read as such.
		s.Drop(metrics.Trees, metrics.StraysFound, metrics.StraysReaped, metrics.StraysFailed)
		return
	}
	counts := map[action.Action]int{}
	for _, a := range []action.Action{action.WouldReap, action.Reaped, action.Gone, action.WouldNotDie,
		action.SkipLive, action.SkipYoung, action.SkipAgeUnknown, action.SkipForeign,
		action.SkipOtherUID, action.SkipAmbiguous, action.SkipContradicted} {
		counts[a] = 0 // every action present, so an old value never lingers
	}
	for _, t := range rep.Trees {
		counts[t.Action]++
	}
	for a, n := range counts {
		s.Set(metrics.Trees, float64(n), string(a))
	}
	found := counts[action.WouldReap] + counts[action.Reaped] + counts[action.Gone] + counts[action.WouldNotDie]
	s.Set(metrics.StraysFound, float64(found))
	s.Set(metrics.StraysReaped, float64(counts[action.Reaped]+counts[action.Gone]))
	s.Set(metrics.StraysFailed, float64(counts[action.WouldNotDie]))
}

// recordSweep records a sweep report.
func recordSweep(s *metrics.Set, rep *sockets.Report) {
	if s == nil || rep == nil {
		return
	}
	verdicts := map[sockets.Verdict]int{sockets.VerdictLive: 0, sockets.VerdictStale: 0, sockets.VerdictUnknown: 0}
	unlinked, failed := 0, 0
	for _, k := range rep.Sockets {
		verdicts[k.Verdict]++
		switch k.Action {
		case sockets.ActionUnlinked:
			unlinked++
		case sockets.ActionFailed:
			failed++
		}
	}
	for v, n := range verdicts {
		s.Set(metrics.Sockets, float64(n), string(v))
	}
	s.Set(metrics.SocketsStale, float64(verdicts[sockets.VerdictStale]))
	s.Set(metrics.SocketsUnlinked, float64(unlinked))
	s.Set(metrics.SocketsFailed, float64(failed))
}

// recordCull records a cull audit.
func recordCull(s *metrics.Set, sups []cull.Supervisor) {
	if s == nil {
		return
	}
	unreadable, sessions := 0, 0
	var mem int64
	for _, sup := range sups {
		if sup.Err != nil {
			unreadable++
			continue
		}
		for _, c := range sup.Candidates {
			sessions++
			mem += c.MemoryBytes()
		}
	}
	s.Set(metrics.Supervisors, float64(len(sups)))
	s.Set(metrics.SupervisorsUnreadable, float64(unreadable))
	s.Set(metrics.SessionsAbandoned, float64(sessions))
	s.Set(metrics.SessionsAbandonedMemoryBytes, float64(mem))
}

// warnf prints a warning on the app's error writer.
func warnf(c *cli.Context, format string, args ...any) {
	w := c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "kc-janitor: "+format+"\n", args...)
}
