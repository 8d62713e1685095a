package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// `kc-hook supervise` runs a supervisor tied to a container's init process
// (the prevention layer, DESIGN §7). kc-hook starts it at createRuntime or
// poststart for containers annotated io.kc-watchman.supervisor=NAME, with
// the command taken from the allowlist; it can be run by hand too.
const (
	superviseName      = "supervise"
	superviseUsage     = "run COMMAND as a supervisor that dies with the container's init process"
	superviseUsageText = "kc-hook [--state-dir DIR] [--kill-grace D] supervise [options] CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...\n\n" +
		"Leads its own process group, runs COMMAND as its child (with a parent-death signal) and, when the\n" +
		"process INIT-PID with start time INIT-START-TICKS dies or on SIGTERM, takes the whole group down\n" +
		"(SIGTERM, --kill-grace, SIGKILL) and exits. Logs JSON lines to stderr."
	helpUsage = "Shows a list of commands or help for one command"
)

const exitUsage = 2

// superviseSettings are supervise's own options.
type superviseSettings struct {
	stateDir        string
	killGrace       time.Duration
	maxRestarts     int
	restartDelay    time.Duration
	maxRestartDelay time.Duration
	stableAfter     time.Duration
	pdeathsig       string
	refresh         time.Duration
	initPoll        time.Duration
	pollInit        bool
	help            bool
}

func (s *superviseSettings) options() []option {
	return []option{
		// Also accepted after "supervise"; when absent there, the global
		// flags (and their environment variables) apply.
		{name: "state-dir", meta: "DIR", usage: "ledger DIR for the group's snapshots", shown: "the global --state-dir", str: &s.stateDir},
		{name: "kill-grace", usage: "wait between SIGTERM and SIGKILL", shown: "the global --kill-grace", dur: &s.killGrace},
		{name: "max-restarts", env: "KC_SUPERVISE_MAX_RESTARTS", usage: "restarts of a COMMAND that exits before giving up (0: never restart)", num: &s.maxRestarts, numDef: supervise.DefaultMaxRestarts},
		{name: "restart-delay", env: "KC_SUPERVISE_RESTART_DELAY", usage: "first backoff before a restart; doubles per restart", dur: &s.restartDelay, durDef: supervise.DefaultRestartDelay},
		{name: "max-restart-delay", env: "KC_SUPERVISE_MAX_RESTART_DELAY", usage: "cap on the backoff", dur: &s.maxRestartDelay, durDef: time.Minute},
		{name: "stable-after", env: "KC_SUPERVISE_STABLE_AFTER", usage: "a COMMAND that ran this long gets its restart budget back", dur: &s.stableAfter, durDef: 10 * time.Minute},
		{name: "pdeathsig", env: "KC_SUPERVISE_PDEATHSIG", usage: "signal COMMAND gets if this wrapper dies (TERM, KILL, INT, HUP)", str: &s.pdeathsig, strDef: supervise.SignalName(supervise.DefaultPdeathSig)},
		{name: "refresh", env: "KC_SUPERVISE_REFRESH", usage: "how often the ledger snapshot of the group is refreshed", dur: &s.refresh, durDef: 10 * time.Second},
		{name: "init-poll", env: "KC_SUPERVISE_INIT_POLL", usage: "interval of identity polling when pidfds are unavailable", dur: &s.initPoll, durDef: 250 * time.Millisecond},
		{name: "poll-init", env: "KC_SUPERVISE_POLL_INIT", usage: "watch the init process by polling even when pidfds work (testing)", bit: &s.pollInit},
		helpOption(&s.help),
	}
}

// superviseHelp is supervise's --help page. withCommands adds the hidden
// help subcommand, which urfave/cli listed on a usage error only.
func superviseHelp(withCommands bool) string {
	var s superviseSettings
	var b strings.Builder
	fmt.Fprintf(&b, "NAME:\n   %s %s - %s\n\n", hookName, superviseName, superviseUsage)
	fmt.Fprintf(&b, "USAGE:\n%s\n\n", indent(superviseUsageText))
	if withCommands {
		fmt.Fprintf(&b, "COMMANDS:\n   help, h  %s\n\n", helpUsage)
	}
	b.WriteString("OPTIONS:\n")
	b.WriteString(optionLines(s.options()))
	return b.String()
}

// helpCommandHelp is the --help page of `kc-hook supervise help`.
func helpCommandHelp(withCommands bool) string {
	var help bool
	var b strings.Builder
	fmt.Fprintf(&b, "NAME:\n   %s %s help - %s\n\n", hookName, superviseName, helpUsage)
	fmt.Fprintf(&b, "USAGE:\n   %s %s help [command options] [command]\n\n", hookName, superviseName)
	if withCommands {
		fmt.Fprintf(&b, "COMMANDS:\n   help, h  %s\n\n", helpUsage)
	}
	b.WriteString("OPTIONS:\n")
	b.WriteString(optionLines([]option{helpOption(&help)}))
	return b.String()
}

// usageError is how a bad flag or variable of supervise was reported: the
// error, supervise's help, and the error again as the last line.
func usageError(stderr io.Writer, help string, err error) int {
	fmt.Fprintf(stderr, "Incorrect Usage: %s\n\n", err)
	io.WriteString(stderr, help)
	fmt.Fprintln(stderr, "kc-hook:", err)
	return exitBadInput
}

func isHelpName(s string) bool { return s == "help" || s == "h" }

// helpTopic answers `--help NAME` below supervise: only the help
// subcommand has a help page there, which lists the help subcommand's own
// help subcommand once that has run (withCommands).
func helpTopic(stderr io.Writer, name string, withCommands bool) int {
	if !isHelpName(name) {
		fmt.Fprintf(stderr, "No help topic for '%v'\n", name)
		return exitNoTopic
	}
	io.WriteString(stderr, helpCommandHelp(withCommands))
	return exitOK
}

// runHelpCommand is `kc-hook supervise help [NAME]` (and `help help …`,
// nested), kept as urfave/cli answered it.
func runHelpCommand(args []string, nested bool, stderr io.Writer) int {
	var help bool
	opts := []option{helpOption(&help)}
	fs, err := newFlagSet(opts)
	if err == nil {
		err = parse(fs, opts, args)
	}
	if err != nil {
		return usageError(stderr, helpCommandHelp(true), err)
	}
	rest := fs.Args()
	switch {
	case !help && len(rest) > 0 && isHelpName(rest[0]):
		return runHelpCommand(rest[1:], true, stderr)
	case len(rest) > 0:
		return helpTopic(stderr, rest[0], true)
	case nested:
		io.WriteString(stderr, helpCommandHelp(false))
	default:
		io.WriteString(stderr, superviseHelp(false))
	}
	return exitOK
}

func runSupervise(g *settings, args []string, stderr io.Writer) int {
	var s superviseSettings
	opts := s.options()
	fs, err := newFlagSet(opts)
	if err == nil {
		err = parse(fs, opts, args)
	}
	if err != nil {
		return usageError(stderr, superviseHelp(true), err)
	}
	args = fs.Args()
	switch {
	case s.help && len(args) == 0:
		io.WriteString(stderr, superviseHelp(false))
		return exitOK
	case s.help:
		return helpTopic(stderr, args[0], false)
	case len(args) > 0 && isHelpName(args[0]):
		return runHelpCommand(args[1:], false, stderr)
	}

	pos, command := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		pos, command = args[:i], args[i+1:]
	} else if len(args) > 3 {
		pos, command = args[:3], args[3:]
	}
	spec, err := supervise.ParseArgs(pos, command)
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook supervise:", err)
		return exitUsage
	}
	sig, err := supervise.ParseSignal(s.pdeathsig)
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook supervise:", err)
		return exitUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	stateDir, grace := s.stateDir, s.killGrace
	if !set["state-dir"] {
		stateDir = g.stateDir
	}
	if !set["kill-grace"] {
		grace = g.killGrace
	}
	if stateDir != "" && !filepath.IsAbs(stateDir) {
		fmt.Fprintf(stderr, "kc-hook supervise: --state-dir must be an absolute path, not %q\n", stateDir)
		return exitUsage
	}
	if s.maxRestarts < 0 || grace <= 0 {
		fmt.Fprintln(stderr, "kc-hook supervise: --max-restarts must not be negative and --kill-grace must be positive")
		return exitUsage
	}

	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("container", spec.ContainerID, "wrapper_pid", os.Getpid())
	var store *ledger.Store
	if stateDir != "" {
		if store, err = ledger.Open(stateDir); err != nil {
			log.Warn("no ledger; the group's snapshot will not be recorded", "err", err)
			store = nil
		}
	}

	// The handler stays installed until Run returns: a SIGTERM arriving
	// while the group is being taken down must not kill the wrapper
	// before its members are gone.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	err = supervise.Run(ctx, supervise.Options{
		Spec:            spec,
		Store:           store,
		KillGrace:       grace,
		MaxRestarts:     s.maxRestarts,
		RestartDelay:    s.restartDelay,
		MaxRestartDelay: s.maxRestartDelay,
		StableAfter:     s.stableAfter,
		PdeathSig:       sig,
		InitPoll:        s.initPoll,
		ForcePoll:       s.pollInit,
		Refresh:         s.refresh,
		Logger:          log,
	})
	switch {
	case err == nil, errors.Is(err, supervise.ErrInitGone):
		return exitOK
	default:
		log.Error("supervise ended", "err", err)
		fmt.Fprintf(stderr, "kc-hook supervise: %v\n", err)
		return exitFailed
	}
}
