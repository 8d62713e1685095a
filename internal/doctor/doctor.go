// Package doctor holds kc-janitor doctor's host checks and their verdicts:
// is the hook installed so that podman actually runs it, has it run, can
// each container engine be asked, is the ledger usable, and is anything left to clean up.
//
// Each check turns what it finds into a Check with a verdict (ok, warn,
// error) and a one-line detail; the command prints one line per check and
// exits with the worst verdict (0, 1, 2).
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/printable"
)

// Verdict of one check. Its numeric value is the exit code it stands for.
type Verdict int

// Verdicts, from best to worst.
const (
	OK    Verdict = 0
	Warn  Verdict = 1
	Error Verdict = 2
)

// String is the verdict as printed in the text report.
func (v Verdict) String() string {
	switch v {
	case OK:
		return "ok"
	case Warn:
		return "WARN"
	}
	return "ERROR"
}

// MarshalJSON renders the verdict as "ok", "warn" or "error".
func (v Verdict) MarshalJSON() ([]byte, error) {
	return json.Marshal(strings.ToLower(v.String()))
}

// UnmarshalJSON is MarshalJSON's inverse.
func (v *Verdict) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	switch s {
	case "ok":
		*v = OK
	case "warn":
		*v = Warn
	case "error":
		*v = Error
	default:
		return fmt.Errorf("unknown verdict %q", s)
	}
	return nil
}

// Check is the outcome of one check. Its JSON object carries "check",
// "verdict", "message" and "remedy" (and "items" when there are any);
// "name" and "detail", its keys before, are kept for one release:
// "name" is "check", "detail" is the text report's parenthesis (the
// message, then the remedy).
type Check struct {
	// Name is the check's stable identifier (hook-installed, ...), used
	// in JSON and as the metrics label.
	Name string `json:"check"`
	// Label is what the text report prints.
	Label   string  `json:"label"`
	Verdict Verdict `json:"verdict"`
	// Detail says what was found, in one line.
	Detail string `json:"message"`
	// Remedy says what to do about it; "" when there is nothing to do.
	Remedy string `json:"remedy"`
	// Items are details worth a line each (the stray trees, the broken
	// descriptors, ...).
	Items []string `json:"items,omitempty"`
}

// Text is the check's detail as the text report prints it: the message,
// then the remedy.
func (c Check) Text() string {
	switch {
	case c.Remedy == "":
		return c.Detail
	case c.Detail == "":
		return "remedy: " + c.Remedy
	}
	return c.Detail + "; remedy: " + c.Remedy
}

// MarshalJSON adds the keys of earlier releases, "name" and "detail".
func (c Check) MarshalJSON() ([]byte, error) {
	type plain Check
	return json.Marshal(struct {
		plain
		Name   string `json:"name"`
		Detail string `json:"detail"`
	}{plain(c), c.Name, c.Text()})
}

// Check names, in report order.
const (
	NameHookInstalled = "hook-installed"
	NameHookAlive     = "hook-alive"
	NameEngines       = "engines"
	NamePodman        = "podman"
	NameDocker        = "docker"
	NameContainerd    = "containerd"
	NameCRI           = "cri"
	NameStateDir      = "state-dir"
	NameListing       = "process-listing"
	NamePidfds        = "death-pidfds"
	NameContainment   = "containment"
	NameStrays        = "stray-trees"
	NameSockets       = "orphan-sockets"
	NameSessions      = "abandoned-sessions"
)

// Names lists every check, in report order.
var Names = []string{NameHookInstalled, NameHookAlive, NameEngines, NamePodman, NameDocker, NameContainerd, NameCRI, NameStateDir, NameListing, NamePidfds, NameContainment, NameStrays, NameSockets, NameSessions}

var labels = map[string]string{
	NameHookInstalled: "hook installed",
	NameHookAlive:     "hook alive",
	NameEngines:       "engines",
	NamePodman:        "podman ground truth",
	NameDocker:        "docker ground truth",
	NameContainerd:    "containerd ground truth",
	NameCRI:           "cri ground truth",
	NameStateDir:      "state dir and ledger",
	NameListing:       "process listing",
	NamePidfds:        "deaths seen from the kernel",
	NameContainment:   "supervisor containment",
	NameStrays:        "orphaned supervisor trees",
	NameSockets:       "orphan sockets",
	NameSessions:      "abandoned sessions",
}

// remedies are what to do about a check that is not ok, where the check
// itself knows nothing more precise: each points to where the details are.
var remedies = map[string]string{
	NameHookInstalled: "install the hook (the package, or sudo make install) so that its descriptors are in a dir podman reads",
	NameHookAlive:     "start and stop a container, then run doctor again; kc-hook's log and trace say why it did not record",
	NameEngines:       "start one, or name it with --engine and its endpoint",
	NamePodman:        "start podman's API service (systemctl enable --now podman.socket) or point --podman-url (KC_PODMAN_URL) at it; without a service the podman CLI must be on PATH",
	NameDocker:        "start dockerd or point --docker-url (KC_DOCKER_URL, DOCKER_HOST) at its socket",
	NameContainerd:    "start containerd or point --containerd-address (KC_CONTAINERD_ADDRESS) at its socket; check --containerd-namespace",
	NameCRI:           "start the CRI runtime (CRI-O: systemctl start crio) or point --cri-endpoint (KC_CRI_ENDPOINT) at its socket",
	NameStateDir:      "make the state dir a directory of this UID, mode 0700, or name another with --state-dir (KC_STATE_DIR)",
	NameListing:       "--bpf auto (the default) lists through /proc where the BPF task iterator cannot run",
	NamePidfds:        "kc-janitor watch logs why a container could not be pinned",
	NameContainment:   "a cgroup v2 or v1 freezer mount lets kc-hook supervise contain its supervisors",
	NameStrays:        "kc-janitor reconcile shows each tree and why",
	NameSockets:       "kc-janitor sweep shows each socket and why",
	NameSessions:      "kc-janitor cull shows each supervisor and session and why",
}

func newCheck(name string, v Verdict, format string, args ...any) Check {
	return Check{Name: name, Label: labels[name], Verdict: v, Detail: fmt.Sprintf(format, args...)}
}

// Report is every check's outcome.
type Report struct {
	Checks []Check `json:"checks"`
	// Worst is the worst verdict; the exit code is its value.
	Worst Verdict `json:"worst"`
	// Fix is true when --fix was given.
	Fix bool `json:"fix"`
	// EngineMode is "auto" or "named" (--engine); Engines is every
	// built-in engine: found by auto or named, asked, and its answer.
	EngineMode string         `json:"engine_mode,omitempty"`
	Engines    []EngineReport `json:"engines,omitempty"`
}

// Add appends a check and updates Worst. A check that is not ok and names
// no remedy of its own gets its kind's.
func (r *Report) Add(c Check) {
	if c.Verdict != OK && c.Remedy == "" {
		c.Remedy = remedies[c.Name]
	}
	r.Checks = append(r.Checks, c)
	if c.Verdict > r.Worst {
		r.Worst = c.Verdict
	}
}

// labelWidth is the width labels are padded to with dots: the longest
// label, a space and three dots.
const labelWidth = 31

// WriteText prints one line per check, `label .... verdict (detail)`, and
// the items indented below it.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, c := range r.Checks {
		dots := labelWidth - len(c.Label) - 1
		if dots < 3 {
			dots = 3
		}
		fmt.Fprintf(&b, "%s %s %s", c.Label, strings.Repeat(".", dots), c.Verdict)
		if t := c.Text(); t != "" {
			fmt.Fprintf(&b, " (%s)", printable.Quote(t))
		}
		b.WriteByte('\n')
		for _, it := range c.Items {
			fmt.Fprintf(&b, "    %s\n", printable.Quote(it))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	if r.Checks == nil {
		r.Checks = []Check{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
