// Package podman is podman's engine client: which containers are alive,
// a --container reference, and container deaths (libpod's event stream, or
// `podman events` where no service runs).
//
// Query first asks the podman API service (libpod's container list), then falls back to
// the podman CLI (`podman ps --all --no-trunc --format json`). If neither
// answers, the error wraps engine.ErrUnknown and callers must do nothing: an empty
// or partial live set taken for the truth would turn every tree into a stray.
package podman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// RootfulSocket is the rootful podman service's default socket.
const RootfulSocket = "/run/podman/podman.sock"

// liveStates are podman's raw container states that count as alive: the
// container exists and its processes may run (or are about to, or are
// being stopped). Anything else — exited, stopped, removing, unknown — is
// not live.
var liveStates = map[string]bool{
	"created":     true,
	"configured":  true,
	"initialized": true,
	"running":     true,
	"paused":      true,
	"stopping":    true,
}

// podmanStates are every state libpod names (ContainerState.String); any
// other means we are not reading the output we think we are, and a
// container it stands for would be taken as not live (DESIGN "Engines":
// a state the engine never reports makes the truth unknown).
var podmanStates = map[string]bool{
	"created": true, "configured": true, "initialized": true, "running": true, "paused": true,
	"stopping": true, "stopped": true, "exited": true, "removing": true, "unknown": true,
}

// IsLiveState reports whether podman's raw state string (ListContainer.State
// in the API, "State" in `podman ps --format json`; never the display
// "Status") counts as live.
func IsLiveState(state string) bool { return liveStates[state] }

// Options configures Query. The zero value asks the default podman.
type Options struct {
	// URL of the podman API service: unix:///path or tcp://host:port.
	// Empty: $CONTAINER_HOST, else DefaultURL().
	URL string
	// PodmanBin is the CLI for the fallback; default "podman" on $PATH.
	PodmanBin string
	// CLIArgs are global arguments put before "ps" in the CLI fallback. Nil
	// means Query decides so that the CLI asks the same podman as URL: no
	// arguments when URL is this process's default socket (the plain CLI
	// reads that podman's store directly, which also works when the service
	// is down), else "--url URL" (the CLI as a second client of the same
	// service). Non-nil (even empty) is used verbatim, e.g. {"--root", R,
	// "--runroot", RR} for a service started on private storage; the caller
	// then vouches that it names the same podman as URL.
	CLIArgs []string
	// Timeout bounds the whole query (API attempt + CLI fallback); default
	// DefaultTimeout (or less if ctx expires sooner). The API attempt gets
	// half of it, the CLI fallback the rest.
	Timeout time.Duration
	// Logger receives debug/warn lines; nil discards them.
	Logger *slog.Logger
	// Only, when set, limits the API's list to these containers (full
	// IDs); the CLI lists every container all the same.
	Only []string
}

// DefaultURL is the API socket of this process's own podman: the rootful
// socket when running as root, else $XDG_RUNTIME_DIR/podman/podman.sock
// (/run/user/<uid> when XDG_RUNTIME_DIR is unset).
func DefaultURL() string {
	if os.Geteuid() == 0 {
		return "unix://" + RootfulSocket
	}
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = "/run/user/" + strconv.Itoa(os.Geteuid())
	}
	return "unix://" + filepath.Join(dir, "podman", "podman.sock")
}

// resolveURL applies the Options.URL defaults.
func resolveURL(u string) string {
	if u != "" {
		return u
	}
	if env := os.Getenv("CONTAINER_HOST"); env != "" {
		return env
	}
	return DefaultURL()
}

// CheckURL reports whether raw is a podman API URL Query can use
// (unix:///path or tcp://host:port), so that a command line can refuse a
// malformed one before anything runs.
func CheckURL(raw string) error {
	_, err := parseEndpoint(raw)
	return err
}

// endpoint is a parsed podman API URL.
type endpoint = engine.URL

// parseEndpoint is engine.ParseURL worded for podman.
func parseEndpoint(raw string) (endpoint, error) {
	ep, err := engine.ParseURL(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("podman URL %w", err)
	}
	return ep, nil
}

// isDefault reports whether ep is this process's own default podman socket,
// which the plain CLI (no --url) reads from the same store.
func isDefault(ep endpoint) bool {
	if ep.Network != "unix" {
		return false
	}
	def, err := parseEndpoint(DefaultURL())
	return err == nil && def.Addr == ep.Addr
}

// cliGlobalArgs returns the global CLI arguments that make `podman ps` ask
// the same podman as ep (see Options.CLIArgs).
func cliGlobalArgs(ep endpoint, override []string) []string {
	if override != nil {
		return override
	}
	if isDefault(ep) {
		return localArgs()
	}
	return []string{"--url", ep.Raw}
}

// localArgs make the CLI read its own store, whatever containers.conf
// says (remote = true, an active service): its answer is then this
// process's, as Query trusts it to be.
func localArgs() []string { return []string{"--remote=false"} }

// LocalCLIArgs returns the global arguments that make the podman CLI read
// the same podman's store as url directly, without its service: override
// when set (the caller vouches for it), localArgs when url is this
// process's default socket. ok is false when the CLI could reach that podman only
// through the service (--url).
func LocalCLIArgs(url string, override []string) (args []string, ok bool) {
	if override != nil {
		return override, true
	}
	ep, err := parseEndpoint(resolveURL(url))
	if err != nil || !isDefault(ep) {
		return nil, false
	}
	return localArgs(), true
}

// Query asks podman which containers are alive: the API at opt.URL first,
// then the CLI (see Options.CLIArgs for which podman the CLI asks). It fails,
// wrapping ErrUnknown, only if both fail — or if the URL is unusable and no
// CLIArgs say which podman to ask instead. However podman behaves, it
// returns within opt.Timeout (plus at most cliWaitDelay if a killed CLI's
// escaped children hold its output open).
//
// Set.UID is the UID the answer is ground truth for: the socket's owner
// when the API (or the CLI through --url) answered, this process's
// effective UID when the plain CLI read its own store.
func Query(ctx context.Context, opt Options) (engine.Set, error) {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = engine.DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	raw := resolveURL(opt.URL)
	ep, epErr := parseEndpoint(raw)

	// API.
	var apiErr error
	if epErr != nil {
		apiErr = epErr
	} else {
		// Half of what is left (the caller's ctx may be shorter than
		// Timeout), so that a hung service leaves the CLI time to answer.
		budget := timeout / 2
		if dl, ok := ctx.Deadline(); ok {
			budget = time.Until(dl) / 2
		}
		actx, acancel := context.WithTimeout(ctx, budget)
		store := parseStoreArgs(opt.CLIArgs)
		if opt.CLIArgs != nil && store.empty() {
			log.Info("--podman-arg names no store (--root/--runroot): it applies to the CLI fallback only", "args", opt.CLIArgs)
		}
		set, err := queryAPI(actx, ep, store, opt.Only, log)
		acancel()
		if err == nil {
			return set, nil
		}
		apiErr = err
		if errors.Is(err, errOtherStore) {
			// The service answers for another store than the arguments
			// name: its list is not the one asked for.
			log.Warn("podman API serves another store than --podman-arg names; asking the CLI with the arguments", "url", raw, "err", err)
		} else {
			// Expected where podman.socket is not enabled: not a warning.
			log.Info("podman API failed, trying the CLI", "url", raw, "err", err)
		}
	}

	// CLI.
	var args []string
	switch {
	case opt.CLIArgs != nil:
		args = opt.CLIArgs
	case epErr != nil:
		// An unusable URL names no podman we could ask the same question.
		return engine.Set{}, fmt.Errorf("%w: %w", engine.ErrUnknown, apiErr)
	default:
		args = cliGlobalArgs(ep, nil)
	}
	set, cliErr := queryCLI(ctx, opt.PodmanBin, args, log)
	if cliErr != nil {
		// The error says it, with the API's: the caller reports it once.
		log.Info("podman CLI failed", "err", cliErr)
		return engine.Set{}, fmt.Errorf("%w: %w; %w", engine.ErrUnknown, apiErr, cliErr)
	}
	set.UID = os.Geteuid()
	if opt.CLIArgs == nil && !isDefault(ep) {
		// The CLI went to the service through --url: we never saw the
		// connection that answered, and a stat of the socket's path can be
		// swapped after the answer, so this answer vouches for nobody's trees.
		set.UID = engine.UIDUnknown
		log.Warn("the podman CLI answered through --url; its service's UID is unknown, so no tree is judged", "url", raw)
	}
	return set, nil
}

// entry is one listed container, whatever the source.
type entry struct {
	ID    string
	State string
	Names []string
	PID   int
}

// listing is the outcome of reading a container list.
type listing struct {
	Live   map[string]bool
	States map[string]string
	Names  map[string][]string
	PIDs   map[string]int
}

// listed accumulates a container list, one entry at a time, so a list
// costs what its containers do, not what its entries decode to. An
// entry without a full container ID fails the whole list: podman never
// makes one, so the output is not what we think it is (a missing
// --no-trunc, a mangled answer), and the container it stands for would
// be missing from a list whose absences say "gone".
type listed struct {
	l listing
}

func (b *listed) add(e entry) error {
	if b.l.Live == nil {
		b.l = listing{Live: map[string]bool{}, States: map[string]string{}, Names: map[string][]string{}, PIDs: map[string]int{}}
	}
	if !containerid.Valid(e.ID) {
		return fmt.Errorf("a listed container has no full 64-hex ID (%q; truncated output?)", e.ID[:min(len(e.ID), 80)])
	}
	if e.State == "" {
		// podman always names a state ("unknown" at worst); none means
		// we are not reading the output we think we are.
		return fmt.Errorf("container %s: no state", e.ID)
	}
	if !podmanStates[e.State] {
		return fmt.Errorf("container %s: unknown state %q", e.ID, e.State[:min(len(e.State), 80)])
	}
	b.l.States[e.ID] = e.State
	if len(e.Names) > 0 {
		b.l.Names[e.ID] = e.Names
	}
	if e.PID > 0 {
		b.l.PIDs[e.ID] = e.PID
	}
	if IsLiveState(e.State) {
		b.l.Live[e.ID] = true
	}
	return nil
}

func (b *listed) done() (listing, error) {
	if b.l.Live == nil {
		b.l = listing{Live: map[string]bool{}, States: map[string]string{}, Names: map[string][]string{}, PIDs: map[string]int{}}
	}
	return b.l, nil
}
