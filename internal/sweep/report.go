package sweep

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/printable"
)

// reportJSON is sweep's JSON report (DESIGN "The outside").
type reportJSON struct {
	DryRun  bool         `json:"dry_run"`
	Sockets []SocketJSON `json:"sockets"`
	// Dirs is additive to DESIGN "The outside"'s object: where sweep looked and why.
	Dirs []dirJSON `json:"dirs"`
}

// dirJSON is one directory (or pattern) looked in, inside the target.
type dirJSON struct {
	Path    string   `json:"path"`
	Sources []string `json:"sources"`
	// Refused is why a directory named by a process was not swept.
	Refused string `json:"refused,omitempty"`
}

// SocketJSON is one socket in sweep's and status's JSON reports.
type SocketJSON struct {
	Path    string  `json:"path"`
	PID     int     `json:"pid"`
	Kind    string  `json:"kind"`
	Verdict string  `json:"verdict"`
	Reason  string  `json:"reason"`
	Action  string  `json:"action"`
	Error   *string `json:"error"`
}

// JSON is s as the reports show it; withErr says whether its error is
// shown (status leaves it out).
func (s *Socket) JSON(withErr bool) SocketJSON {
	j := SocketJSON{Path: s.Path, PID: s.PID, Kind: string(s.Kind), Verdict: string(s.Verdict),
		Reason: s.Reason, Action: string(s.Action)}
	if withErr && s.Err != nil {
		msg := s.Err.Error()
		j.Error = &msg
	}
	return j
}

// Acted counts the sockets unlinked or that would be.
func (r *Report) Acted() int {
	n := 0
	for _, s := range r.Sockets {
		if s.Action == ActionUnlinked || s.Action == ActionWouldUnlink {
			n++
		}
	}
	return n
}

// Log writes the run's summary line, also when nothing was found; the
// candidates were logged one by one as [DRY-RUN] or [SWEEP] lines.
func (r *Report) Log(log *slog.Logger) {
	count := map[Verdict]int{}
	for _, s := range r.Sockets {
		count[s.Verdict]++
	}
	verb := "unlinked"
	if r.DryRun {
		verb = "would_unlink"
	}
	log.Info("sweep", "dry_run", r.DryRun, "sockets", len(r.Sockets), "live", count[VerdictLive],
		"stale", count[VerdictStale], "unknown", count[VerdictUnknown], verb, r.Acted(),
		"dir_errors", len(r.DirErrors), "unprobed", r.Unprobed)
}

// WriteJSON writes sweep's JSON report.
func (r *Report) WriteJSON(w io.Writer) error {
	out := reportJSON{DryRun: r.DryRun, Sockets: []SocketJSON{}, Dirs: []dirJSON{}}
	for _, s := range r.Sockets {
		out.Sockets = append(out.Sockets, s.JSON(true))
	}
	for _, d := range r.Dirs {
		out.Dirs = append(out.Dirs, dirJSON{Path: d.Path, Sources: d.Sources, Refused: d.Refused})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// WriteText writes sweep's text report: one line per socket, then the
// counts.
func (r *Report) WriteText(w io.Writer) error {
	count := map[Verdict]int{}
	acted := 0
	for _, s := range r.Sockets {
		count[s.Verdict]++
		path, reason := printable.Quote(s.Path), printable.Quote(s.Reason)
		what := fmt.Sprintf("%s (%s, pid %d)", path, s.Kind, s.PID)
		if s.Hashed {
			what = fmt.Sprintf("%s (%s, hashed name, no pid)", path, s.Kind)
		}
		var err error
		switch s.Action {
		case ActionWouldUnlink:
			acted++
			_, err = fmt.Fprintf(w, "[DRY-RUN] would unlink %s: %s\n", what, reason)
		case ActionUnlinked:
			acted++
			_, err = fmt.Fprintf(w, "unlinked %s: %s\n", what, reason)
		case ActionFailed:
			_, err = fmt.Fprintf(w, "FAILED to unlink %s: %s (%s)\n", what, printable.Quote(fmt.Sprint(s.Err)), reason)
		default:
			_, err = fmt.Fprintf(w, "kept %s, %s: %s\n", what, s.Verdict, reason)
		}
		if err != nil {
			return err
		}
	}
	for _, d := range r.Dirs {
		if d.Refused != "" && !errors.Is(d.err, fs.ErrNotExist) {
			if _, err := fmt.Fprintf(w, "not swept %s (named by %s): %s\n", printable.Quote(d.Path), strings.Join(d.Sources, ", "), printable.Quote(d.Refused)); err != nil {
				return err
			}
		}
	}
	if r.Unprobed > 0 {
		if _, err := fmt.Fprintf(w, "%d sockets not probed before the sweep deadline: unknown, kept\n", r.Unprobed); err != nil {
			return err
		}
	}
	verb := "unlinked"
	if r.DryRun {
		verb = "would unlink"
	}
	_, err := fmt.Fprintf(w, "%d sockets: %d live, %d stale, %d unknown; %s %d\n",
		len(r.Sockets), count[VerdictLive], count[VerdictStale], count[VerdictUnknown], verb, acted)
	return err
}
