package cull

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/printable"
)

// reportJSON is cull's JSON report (DESIGN "The outside").
type reportJSON struct {
	ThresholdSeconds int64            `json:"threshold_seconds"`
	Supervisors      []supervisorJSON `json:"supervisors"`
}

type supervisorJSON struct {
	Socket        string          `json:"socket"`
	PID           int             `json:"pid"`
	SessionsTotal int             `json:"sessions_total"`
	MemoryBytes   int64           `json:"memory_bytes"`
	Error         *string         `json:"error"`
	Candidates    []candidateJSON `json:"candidates"`
	// CandidatesUnlisted counts those past the audit's bounds.
	CandidatesUnlisted int `json:"candidates_unlisted,omitempty"`
}

type candidateJSON struct {
	SessionID        string `json:"session_id"`
	Language         string `json:"language"`
	Status           string `json:"status"`
	Connected        bool   `json:"connected"`
	IdleSeconds      int64  `json:"idle_seconds"`
	MemoryBytes      int64  `json:"memory_bytes"`
	WorkingDirectory string `json:"working_directory"`
}

// Log writes cull's audit record: one [AUDIT] line per idle session, an
// error per unreadable supervisor, then one summary line, also when
// nothing was found. It returns whether a supervisor could not be read and
// how many sessions were found.
func Log(log *slog.Logger, threshold int64, sups []Supervisor) (failed bool, n int) {
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
		if s.Unlisted > 0 {
			n += s.Unlisted
			log.Warn("[AUDIT] idle sessions past the audit's bound, counted but not listed", "socket", s.Socket, "pid", s.PID,
				"sessions", s.Unlisted, "memory_bytes", s.UnlistedMemoryBytes)
		}
	}
	log.Info("cull", "supervisors", len(sups), "abandoned_sessions", n, "threshold_seconds", threshold)
	return failed, n
}

// WriteJSON writes cull's JSON report.
func WriteJSON(w io.Writer, threshold int64, sups []Supervisor) error {
	out := reportJSON{ThresholdSeconds: threshold, Supervisors: []supervisorJSON{}}
	for _, s := range sups {
		j := supervisorJSON{
			Socket: s.Socket, PID: s.PID, SessionsTotal: s.SessionsTotal,
			MemoryBytes: s.MemoryBytes, Candidates: []candidateJSON{}, CandidatesUnlisted: s.Unlisted,
		}
		if s.Err != nil {
			msg := s.Err.Error()
			j.Error = &msg
		}
		for _, c := range s.Candidates {
			j.Candidates = append(j.Candidates, candidateJSON{
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

// WriteText writes cull's text report: each supervisor, its idle
// sessions, then the totals.
func WriteText(w io.Writer, threshold int64, sups []Supervisor) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	limit := ExactSeconds(threshold)
	total, mem := 0, int64(0)
	for _, s := range sups {
		if s.Err != nil {
			fmt.Fprintf(tw, "%s (pid %s): ERROR: %s\n", printable.Quote(s.Socket), pidText(s.PID), printable.Quote(s.Err.Error()))
			continue
		}
		fmt.Fprintf(tw, "%s (pid %s): %s, %s kernel memory, %d idle > %s\n",
			printable.Quote(s.Socket), pidText(s.PID), plural(s.SessionsTotal, "session"), HumanBytes(s.MemoryBytes), len(s.Candidates)+s.Unlisted, limit)
		total += s.Unlisted
		mem = kallichore.AddBytes(mem, s.UnlistedMemoryBytes)
		if s.Unlisted > 0 {
			fmt.Fprintf(tw, "  %s, holding %s, past the audit's bound: counted, not listed\n", plural(s.Unlisted, "more session"), HumanBytes(s.UnlistedMemoryBytes))
		}
		if len(s.Candidates) == 0 {
			continue
		}
		fmt.Fprintln(tw, "  SESSION\tLANGUAGE\tSTATUS\tIDLE\tMEMORY\tWORKING DIRECTORY")
		for _, c := range s.Candidates {
			total++
			mem = kallichore.AddBytes(mem, c.MemoryBytes())
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", printable.Quote(c.SessionID), printable.Quote(Dash(c.Language)), printable.Quote(c.Status),
				HumanSeconds(c.IdleSeconds), HumanBytes(c.MemoryBytes()), printable.Quote(Dash(c.WorkingDirectory)))
		}
	}
	fmt.Fprintf(tw, "%s; %s idle and disconnected for more than %s, holding %s; nothing was shut down\n",
		plural(len(sups), "supervisor"), plural(total, "session"), limit, HumanBytes(mem))
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

// Dash is s, or "-" when s is blank.
func Dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// HumanSeconds renders seconds as e.g. "1d2h", "3h4m", "2h", "59s": the
// two largest units, a zero second one left out.
func HumanSeconds(s int64) string {
	d := time.Duration(s) * time.Second
	two := func(a int64, au string, b int64, bu string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, au)
		}
		return fmt.Sprintf("%d%s%d%s", a, au, b, bu)
	}
	switch {
	case s >= 86400:
		return two(s/86400, "d", (s%86400)/3600, "h")
	case d >= time.Hour:
		return two(s/3600, "h", (s%3600)/60, "m")
	case d >= time.Minute:
		return two(s/60, "m", s%60, "s")
	}
	return fmt.Sprintf("%ds", s)
}

// ExactSeconds renders seconds in days, hours, minutes and seconds,
// leaving out the zero ones: "1d12h30m", "24h" is "1d". A threshold is
// written so, never rounded, so that what the report says is the rule.
func ExactSeconds(s int64) string {
	if s <= 0 {
		return "0s"
	}
	var b strings.Builder
	for _, u := range []struct {
		n    int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		if q := s / u.n; q > 0 {
			fmt.Fprintf(&b, "%d%s", q, u.name)
			s -= q * u.n
		}
	}
	return b.String()
}

// HumanBytes renders n bytes as e.g. "512 B", "1.5 MiB".
func HumanBytes(n int64) string {
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
