package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

func cullCommand() *cli.Command {
	return &cli.Command{
		Name:  "cull",
		Usage: "audit kernel sessions left idle and disconnected (never shuts anything down)",
		Description: `Reads GET /sessions from every live supervisor (found like sweep finds
them, or named with --socket) and reports the sessions with
connected == false, status == "idle" and idle_seconds > --idle, with their
language, idle time, memory and working directory, and each supervisor's
total kernel memory. Reclaiming a session stays manual.

--idle takes a duration (24h) or seconds (86400); KC_IDLE_SECONDS works as
in the seed culler. KC_CULLER_LOG names a log file when --log-file is not
given.`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "idle", Value: "24h", Usage: "report sessions idle longer than `DURATION` (or seconds)", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
			&cli.StringSliceFlag{Name: "socket", Usage: "audit the supervisor on control socket `PATH` (repeatable) instead of discovering them", EnvVars: []string{"KC_SOCKET"}},
		}, socketFlags()...),
		Action: runCull,
	}
}

func runCull(c *cli.Context) error {
	se, err := preamble(c, "cull", plan{target: true, idle: true, logEnv: "KC_CULLER_LOG"})
	if err != nil {
		return err
	}
	defer se.close()
	g, log, cfg, threshold := se.g, se.log, se.s.Sockets, se.s.Threshold

	var sources []cull.Source
	// Named paths that are no socket are reported as not read, in the
	// order given, and never asked (a retry would only wait to be refused
	// again).
	notSockets := map[int]cull.Supervisor{}
	if paths := c.StringSlice("socket"); len(paths) > 0 {
		for i, p := range paths {
			if p == "" {
				return usageErr("--socket must not be empty")
			}
			src := cull.Source{Socket: p}
			if n, ok := sockets.ParseName(filepath.Base(p)); ok {
				src.PID = n.PID
			}
			if err := isSocket(p); err != nil {
				notSockets[i] = cull.Supervisor{Source: src, Err: err}
				continue
			}
			sources = append(sources, src)
		}
	} else {
		// A dry run, for classification only; its per-socket records
		// ("would unlink") belong to sweep's log, not cull's.
		cfg.Logger = nil
		rep, err := sweep.Sweep(c.Context, cfg)
		if err != nil {
			return cli.Exit(fmt.Sprintf("cull: finding supervisors: %v", err), exitFailed)
		}
		for _, e := range rep.DirErrors {
			log.Warn("socket directory", "err", e)
		}
		sources = append(sources, cull.Sources(rep.Sockets, func(s *sweep.Socket) {
			log.Info("supervisor socket not live, not audited", "path", s.Path, "verdict", string(s.Verdict), "reason", s.Reason)
		})...)
	}

	sups := janitor.Audit(c.Context, cfg, sources, threshold)
	for i := 0; len(notSockets) > 0; i++ {
		if sup, ok := notSockets[i]; ok {
			sups = slices.Insert(sups, i, sup)
			delete(notSockets, i)
		}
	}
	janitor.RecordCull(metricsOf(c), sups)
	failed, _ := cull.Log(log, threshold, sups)
	switch {
	case g.JSON:
		err = cull.WriteJSON(c.App.Writer, threshold, sups)
	case g.Quiet() && !failed:
		// A quiet run prints only failures: its findings are in the log
		// (for cron, which mails whatever reaches stdout).
	default:
		err = cull.WriteText(c.App.Writer, threshold, sups)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	if failed {
		return cli.Exit("", exitFailed)
	}
	return nil
}

// isSocket says why path, named with --socket, is no socket to ask. An
// abstract name (@name) has no file to look at: it is asked.
func isSocket(path string) error {
	if strings.HasPrefix(path, "@") {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%s is not a socket (%s)", path, fileKind(fi.Mode()))
	}
	return nil
}

// fileKind names a file's type as an operator would.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}
