package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

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
			&cli.StringSliceFlag{Name: "socket", Usage: "audit the supervisor on control socket `PATH` (absolute, not a symlink itself; repeatable) instead of discovering them; not with --container", EnvVars: []string{"KC_SOCKET"}},
		}, socketFlags()...),
		Action: runCull,
	}
}

func runCull(c *cli.Context) error {
	se, err := preamble(c, "cull", plan{target: true, idle: true, logEnv: "KC_CULLER_LOG", check: func(globals) error {
		// A socket named by path is read from the host: with a
		// container named too, the run would widen past it.
		if slices.ContainsFunc(c.StringSlice("socket"), func(p string) bool { return strings.TrimSpace(p) != "" }) &&
			(c.String(flagContainer) != "" || c.Int(flagContainerPID) > 0) {
			return usageErr("--socket (KC_SOCKET) names host paths: it does not go with --container (KC_CONTAINER); to audit a container's supervisors, leave --socket out")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer se.close()
	g, log, cfg, threshold := se.g, se.log, se.s.Sockets, se.s.Threshold

	var sources []cull.Source
	// The named sockets in the order given; those that are no socket are
	// reported as not read, never asked (a retry would only wait to be
	// refused again).
	var named []cull.Supervisor
	dirFailed := false
	if paths := c.StringSlice("socket"); len(paths) > 0 {
		pp := sweep.NewPathPinner("/proc")
		defer pp.Close()
		for _, p := range paths {
			if p == "" {
				return usageErr("--socket must not be empty")
			}
			if !filepath.IsAbs(p) {
				// Cron's working directory is not the operator's.
				return usageErr("--socket must be an absolute path, not %q", p)
			}
			src := cull.Source{Socket: p}
			if n, ok := sockets.ParseName(filepath.Base(p)); ok {
				src.PID = n.PID
			}
			err := isSocket(pp, p)
			if err == nil {
				// The audit walks the path again with the same pinner:
				// the mount tables are read once.
				src.Pin = func() (sockets.Pinned, error) { return pp.Pin(p) }
				sources = append(sources, src)
			}
			named = append(named, cull.Supervisor{Source: src, Err: err})
		}
	} else {
		// A dry run, for classification only; its per-socket records
		// ("would unlink") belong to sweep's log, not cull's.
		cfg.Logger = nil
		cfg.KeepDirs = true // the audit dials through them (Socket.Pin)
		rep, err := sweep.Sweep(c.Context, cfg)
		if err != nil {
			return cli.Exit(fmt.Sprintf("cull: finding supervisors: %v", err), exitFailed)
		}
		defer rep.Close()
		for _, e := range rep.DirErrors {
			log.Error("socket directory", "err", e)
		}
		dirFailed = len(rep.DirErrors) > 0
		sources = append(sources, cull.Sources(rep.Sockets, func(s *sweep.Socket) {
			log.Info("supervisor socket not live, not audited", "path", s.Path, "verdict", string(s.Verdict), "reason", s.Reason)
		})...)
	}

	sups := janitor.Audit(c.Context, cfg, sources, threshold)
	if named != nil {
		audited := sups
		for i := range named {
			if named[i].Err == nil {
				named[i], audited = audited[0], audited[1:]
			}
		}
		sups = named
	}
	janitor.RecordCull(metricsOf(c), sups)
	failed, _ := cull.Log(log, threshold, sups)
	// A socket directory that could not be read hides supervisors as a
	// supervisor that could not be read hides sessions.
	failed = failed || dirFailed
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
// abstract address (@name) is taken as it is.
func isSocket(pp *sweep.PathPinner, path string) error {
	if strings.HasPrefix(path, "@") {
		return nil
	}
	// Not followed: the audit dials the socket file itself, never what a
	// symlink points at; reached as the audit reaches it.
	st, err := pp.Lstat(path)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%s is not a socket (%s)", path, sweep.FileType(st.Mode&unix.S_IFMT))
	}
	return nil
}
