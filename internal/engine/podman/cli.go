package podman

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/headbuf"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
)

// cliWaitDelay bounds how long queryCLI waits for the CLI's output pipes
// after the process exited or was killed (a grandchild may hold them).
const cliWaitDelay = 500 * time.Millisecond

// maxStderr bounds the CLI stderr quoted in errors.
const maxStderr = 512

// queryCLI runs `<bin> <global...> ps --all --no-trunc --format json` and
// parses its output. The CLI runs in its own process group, killed as a
// whole when ctx is done, so a hanging podman (or a wrapper script and its
// children) cannot outlive the query.
func queryCLI(ctx context.Context, bin string, global []string, log *slog.Logger) (engine.Set, error) {
	args := append(append([]string{}, global...), "ps", "--all", "--no-trunc", "--format", "json")
	cmd, err := Command(ctx, bin, args)
	if err != nil {
		return engine.Set{}, err
	}
	// A list as large as the API's biggest answer is the most we read;
	// a CLI that prints more (a wrapper gone wrong) is no answer.
	stdout, stderr := &headbuf.Buffer{Max: maxAPIBody}, &headbuf.Buffer{Max: 4096}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	endpoint := cmd.Path + " " + strings.Join(args, " ")

	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		return engine.Set{}, fmt.Errorf("podman CLI %s: %w (after %v)", endpoint, context.Cause(ctx), took.Round(time.Millisecond))
	}
	if err != nil {
		return engine.Set{}, fmt.Errorf("podman CLI %s: %w%s", endpoint, err, QuoteStderr(stderr.Bytes()))
	}
	if stdout.Dropped() {
		return engine.Set{}, fmt.Errorf("podman CLI %s: printed more than %d MiB, more than any list we read", endpoint, maxAPIBody>>20)
	}
	l, err := parseCLI(stdout.Bytes())
	if err != nil {
		return engine.Set{}, fmt.Errorf("podman CLI %s: %w%s", endpoint, err, QuoteStderr(stderr.Bytes()))
	}
	set := engine.Set{
		Source:   engine.SourceCLI,
		Live:     l.Live,
		States:   l.States,
		Names:    l.Names,
		PIDs:     l.PIDs,
		Endpoint: endpoint,
		Took:     took,
	}
	log.Debug("podman CLI answered", "cmd", endpoint, "containers", len(set.States), "live", len(set.Live), "took", took)
	return set, nil
}

// Command is the podman CLI `bin args...` (bin "" is "podman" on $PATH) as
// kc-janitor runs it: without the variables that would send it to another
// podman, in its own process group, killed as a whole when ctx is done, so
// a hanging podman (or a wrapper script and its children) cannot outlive
// the caller.
func Command(ctx context.Context, bin string, args []string) (*exec.Cmd, error) {
	if bin == "" {
		bin = "podman"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("podman CLI: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = cliEnv(os.Environ())
	cmd.Stdin = nil
	// Pdeathsig: a `podman events` child lives as long as watch does, and
	// must not outlive a watch that is SIGKILLed or crashes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// podman may re-exec or fork helpers, a wrapper script has children.
	pgkill.OwnGroupKilledOnCancel(cmd)
	cmd.WaitDelay = cliWaitDelay
	return cmd, nil
}

// cliEnv drops the variables that would point the CLI at another podman
// than the arguments say (podman 4 goes remote when CONTAINER_HOST is set).
func cliEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "CONTAINER_HOST=") || strings.HasPrefix(kv, "CONTAINER_CONNECTION=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// QuoteStderr is a CLI's stderr as the tail of an error: ": " and its
// first maxStderr bytes on one line, or "" when it said nothing.
func QuoteStderr(b []byte) string {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	if len(s) > maxStderr {
		s = s[:maxStderr] + "…"
	}
	return ": " + strings.ReplaceAll(s, "\n", " | ")
}

// cliContainer is the part of a `podman ps --format json` entry we read.
// State is podman's raw state ("running", "exited", ...) — never Status,
// which is the display string ("Up 3 minutes").
type cliContainer struct {
	ID    string          `json:"Id"`
	State json.RawMessage `json:"State"`
	Names []string        `json:"Names"`
	Pid   int             `json:"Pid"`
}

// errNoOutput is parseCLI's error for empty output: podman prints "[]" when
// there are no containers, so nothing at all means something went wrong.
var errNoOutput = errors.New("no output")

// parseCLI reads `podman ps --all --no-trunc --format json`. A JSON array
// of containers, "[]" for none, is accepted; empty output, "null" (podman
// has printed "[]" for no containers since 1.6; taken for an answer it
// would make every tree look stray), anything else, or an entry whose
// State is missing or not a string, or whose ID is not a full one (see
// listed), is an error.
//
// The list is decoded one entry at a time: an entry of "{}" is 3 bytes of
// the answer and a struct once decoded, and the answer may be a user's
// service's.
func parseCLI(out []byte) (listing, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return listing{}, errNoOutput
	}
	if !json.Valid(out) {
		return listing{}, fmt.Errorf("parse ps JSON: %w", json.Unmarshal(out, new(any)))
	}
	if bytes.Equal(out, []byte("null")) {
		return listing{}, fmt.Errorf("parse ps JSON: null, not a list")
	}
	var b listed
	dec := json.NewDecoder(bytes.NewReader(out))
	if t, _ := dec.Token(); t != json.Delim('[') {
		return listing{}, fmt.Errorf("parse ps JSON: not a list")
	}
	var c cliContainer
	for i := 0; dec.More(); i++ {
		c = cliContainer{}
		if err := dec.Decode(&c); err != nil {
			return listing{}, fmt.Errorf("parse ps JSON: entry %d: %w", i, err)
		}
		var state string
		if len(c.State) > 0 {
			if err := json.Unmarshal(c.State, &state); err != nil {
				return listing{}, fmt.Errorf("parse ps JSON: entry %d (%.80q): State %.80s is not a string", i, c.ID, c.State)
			}
		}
		if err := b.add(entry{ID: c.ID, State: state, Names: c.Names, PID: c.Pid}); err != nil {
			return listing{}, err
		}
	}
	return b.done()
}
