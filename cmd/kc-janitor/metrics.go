package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/metrics"
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
		case "version", "man", "completion", "config-doc", "install-hook":
			return action(c)
		}
		if path == "" {
			return action(c)
		}
		if err := checkParentDir(path); err != nil {
			return usageErr("--metrics-file: %v", err)
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

// warnf prints a warning on the app's error writer.
func warnf(c *cli.Context, format string, args ...any) {
	w := c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "kc-janitor: "+format+"\n", args...)
}
