package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
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
given.

Exit status: 0 ok; 1 a supervisor could not be read (the others are still
reported).`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "idle", Value: "24h", Usage: "report sessions idle longer than `DURATION` (or seconds)", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
			&cli.StringSliceFlag{Name: "socket", Usage: "audit the supervisor on control socket `PATH` (repeatable) instead of discovering them", EnvVars: []string{"KC_SOCKET"}},
		}, socketFlags()...),
		Action: runCull,
	}
}

type cullJSON struct {
	ThresholdSeconds int64            `json:"threshold_seconds"`
	Supervisors      []cullSupervisor `json:"supervisors"`
}

type cullSupervisor struct {
	Socket        string          `json:"socket"`
	PID           int             `json:"pid"`
	SessionsTotal int             `json:"sessions_total"`
	MemoryBytes   int64           `json:"memory_bytes"`
	Error         *string         `json:"error"`
	Candidates    []cullCandidate `json:"candidates"`
}

type cullCandidate struct {
	SessionID        string `json:"session_id"`
	Language         string `json:"language"`
	Status           string `json:"status"`
	Connected        bool   `json:"connected"`
	IdleSeconds      int64  `json:"idle_seconds"`
	MemoryBytes      int64  `json:"memory_bytes"`
	WorkingDirectory string `json:"working_directory"`
}

func runCull(c *cli.Context) error {
	g, err := loadGlobals(c)
	if err != nil {
		return err
	}
	threshold, err := cull.ParseIdle(c.String("idle"))
	if err != nil {
		return usageErr("--idle: %v", err)
	}
	log, closeLog, err := newLogger(g.reporting(), logFileOr(g, "KC_CULLER_LOG"))
	if err != nil {
		return err
	}
	defer closeLog()
	log = log.With("cmd", "cull")
	cfg, err := sweepConfig(c, g)
	if err != nil {
		return err
	}

	var sources []cull.Source
	if paths := c.StringSlice("socket"); len(paths) > 0 {
		for _, p := range paths {
			if p == "" {
				return usageErr("--socket must not be empty")
			}
			src := cull.Source{Socket: p}
			if n, ok := sockets.ParseName(filepath.Base(p)); ok {
				src.PID = n.PID
			}
			sources = append(sources, src)
		}
	} else {
		// A dry run, for classification only; its per-socket records
		// ("would unlink") belong to sweep's log, not cull's.
		cfg.Logger = nil
		rep, err := sockets.Sweep(c.Context, cfg)
		if err != nil {
			return cli.Exit(fmt.Sprintf("cull: finding supervisors: %v", err), exitFailed)
		}
		for _, e := range rep.DirErrors {
			log.Warn("socket directory", "err", e)
		}
		sources = append(sources, cull.Sources(rep.Sockets, func(s *sockets.Socket) {
			log.Info("supervisor socket not live, not audited", "path", s.Path, "verdict", string(s.Verdict), "reason", s.Reason)
		})...)
	}

	client := &kallichore.Client{Timeout: cfg.Timeout, RetryAfter: sockets.DefaultPause}
	sups := cull.Audit(c.Context, client, sources, threshold, cfg.Workers)
	recordCull(metricsOf(c), sups)
	failed, n := logCull(log, threshold, sups)
	switch {
	case g.JSON:
		err = writeCullJSON(c.App.Writer, threshold, sups)
	case g.Quiet() && !failed && n == 0:
		// Nothing to report: a quiet run prints nothing.
	default:
		err = writeCullText(c.App.Writer, threshold, sups)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	if failed {
		return cli.Exit("", exitFailed)
	}
	return nil
}

// logCull writes the audit record: one [AUDIT] line per idle session, an
// error per unreadable supervisor, then one summary line, also when
// nothing was found. It returns whether a supervisor could not be read and
// how many sessions were found.
func logCull(log *slog.Logger, threshold int64, sups []cull.Supervisor) (failed bool, n int) {
	for _, s := range sups {
		if s.Err != nil {
			failed = true
			log.Error("cannot read sessions", "socket", s.Socket, "pid", s.PID, "err", s.Err)
			continue
		}
		for _, cand := range s.Candidates {
			n++
			log.Info("[AUDIT] idle session", "socket", s.Socket, "pid", s.PID, "session_id", cand.SessionID,
				"language", cand.Language, "idle_seconds", cand.IdleSeconds, "memory_bytes", cand.MemoryBytes(),
				"working_directory", cand.WorkingDirectory)
		}
	}
	log.Info("cull", "supervisors", len(sups), "abandoned_sessions", n, "threshold_seconds", threshold)
	return failed, n
}

func writeCullJSON(w io.Writer, threshold int64, sups []cull.Supervisor) error {
	out := cullJSON{ThresholdSeconds: threshold, Supervisors: []cullSupervisor{}}
	for _, s := range sups {
		j := cullSupervisor{
			Socket: s.Socket, PID: s.PID, SessionsTotal: s.SessionsTotal,
			MemoryBytes: s.MemoryBytes, Candidates: []cullCandidate{},
		}
		if s.Err != nil {
			msg := s.Err.Error()
			j.Error = &msg
		}
		for _, c := range s.Candidates {
			j.Candidates = append(j.Candidates, cullCandidate{
				SessionID: c.SessionID, Language: c.Language, Status: c.Status, Connected: c.Connected,
				IdleSeconds: c.IdleSeconds, MemoryBytes: c.MemoryBytes(), WorkingDirectory: c.WorkingDirectory,
			})
		}
		out.Supervisors = append(out.Supervisors, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeCullText(w io.Writer, threshold int64, sups []cull.Supervisor) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	limit := humanSeconds(threshold)
	total, mem := 0, int64(0)
	for _, s := range sups {
		if s.Err != nil {
			fmt.Fprintf(tw, "%s (pid %s): ERROR: %v\n", s.Socket, pidText(s.PID), s.Err)
			continue
		}
		fmt.Fprintf(tw, "%s (pid %s): %s, %s kernel memory, %d idle > %s\n",
			s.Socket, pidText(s.PID), plural(s.SessionsTotal, "session"), humanBytes(s.MemoryBytes), len(s.Candidates), limit)
		if len(s.Candidates) == 0 {
			continue
		}
		fmt.Fprintln(tw, "  SESSION\tLANGUAGE\tSTATUS\tIDLE\tMEMORY\tWORKING DIRECTORY")
		for _, c := range s.Candidates {
			total++
			mem += c.MemoryBytes()
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", c.SessionID, dash(c.Language), c.Status,
				humanSeconds(c.IdleSeconds), humanBytes(c.MemoryBytes()), dash(c.WorkingDirectory))
		}
	}
	fmt.Fprintf(tw, "%s; %s idle and disconnected for more than %s, holding %s; nothing was shut down\n",
		plural(len(sups), "supervisor"), plural(total, "session"), limit, humanBytes(mem))
	return tw.Flush()
}

// plural is "1 session", "2 sessions".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// pidText is a PID, or "unknown" for a hashed socket name that carries none.
func pidText(pid int) string {
	if pid <= 0 {
		return "unknown"
	}
	return fmt.Sprint(pid)
}

func dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// humanSeconds renders seconds as e.g. "1d2h", "3h4m", "59s".
func humanSeconds(s int64) string {
	d := time.Duration(s) * time.Second
	days := s / 86400
	switch {
	case days > 0 && (s%86400)/3600 == 0:
		return fmt.Sprintf("%dd", days)
	case days > 0:
		return fmt.Sprintf("%dd%dh", days, (s%86400)/3600)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", s/3600, (s%3600)/60)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	}
	return fmt.Sprintf("%ds", s)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
