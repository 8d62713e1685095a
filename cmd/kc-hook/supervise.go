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
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/contain/systemd"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// `kc-hook supervise` runs a supervisor tied to a container's init process
// (the prevention layer, DESIGN "Parts: three layers and a backstop"). kc-hook starts it at createRuntime or
// poststart for containers annotated io.kc-watchman.supervisor=NAME, with
// the command taken from the allowlist; it can be run by hand too.
const (
	superviseName = "supervise"
	superviseCmd  = hookName + " " + superviseName
	superviseHelp = `Usage: kc-hook [--state-dir DIR] [--kill-grace D] supervise [options]
               CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...

Run COMMAND as a supervisor that dies with the container's init process:
lead a process group, run COMMAND as its child (with a parent-death signal)
and, when the process INIT-PID with start time INIT-START-TICKS dies or on
SIGTERM, take the whole group down (SIGTERM, --kill-grace, SIGKILL) and exit.
COMMAND runs in a cgroup of its own where the host allows (see doctor's
containment check); what the group's stop leaves there (a daemon, a setsid
child) is frozen and killed, and the cgroup removed. Logs JSON lines to stderr.

Options:
`
)

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
	noContain       bool
}

// superviseEnv names the environment variable of each supervise flag that
// has one; --state-dir and --kill-grace fall back to the global flags.
var superviseEnv = map[string]string{
	"max-restarts":      "KC_SUPERVISE_MAX_RESTARTS",
	"restart-delay":     "KC_SUPERVISE_RESTART_DELAY",
	"max-restart-delay": "KC_SUPERVISE_MAX_RESTART_DELAY",
	"stable-after":      "KC_SUPERVISE_STABLE_AFTER",
	"pdeathsig":         "KC_SUPERVISE_PDEATHSIG",
	"refresh":           "KC_SUPERVISE_REFRESH",
	"init-poll":         "KC_SUPERVISE_INIT_POLL",
	"poll-init":         "KC_SUPERVISE_POLL_INIT",
	"no-contain":        "KC_SUPERVISE_NO_CONTAIN",
}

func (s *superviseSettings) flagSet() *flag.FlagSet {
	fs := newFlagSet(superviseCmd)
	fs.StringVar(&s.stateDir, "state-dir", "", "ledger `DIR` for the group's snapshots (default: the global --state-dir)")
	fs.DurationVar(&s.killGrace, "kill-grace", 0, "wait between SIGTERM and SIGKILL (default: the global --kill-grace)")
	fs.IntVar(&s.maxRestarts, "max-restarts", supervise.DefaultMaxRestarts, "restarts of a COMMAND that exits before giving up (0: never restart)")
	fs.DurationVar(&s.restartDelay, "restart-delay", supervise.DefaultRestartDelay, "first backoff before a restart; doubles per restart; positive")
	fs.DurationVar(&s.maxRestartDelay, "max-restart-delay", time.Minute, "cap on the backoff; positive")
	fs.DurationVar(&s.stableAfter, "stable-after", 10*time.Minute, "a COMMAND that ran this long gets its restart budget back; positive")
	fs.StringVar(&s.pdeathsig, "pdeathsig", supervise.SignalName(supervise.DefaultPdeathSig), "`SIGNAL` COMMAND gets if this wrapper dies (TERM, KILL, INT, HUP)")
	fs.DurationVar(&s.refresh, "refresh", 10*time.Second, "how often the ledger snapshot of the group is refreshed; positive")
	fs.DurationVar(&s.initPoll, "init-poll", 250*time.Millisecond, "interval of identity polling when pidfds are unavailable; positive")
	fs.BoolVar(&s.pollInit, "poll-init", false, "watch the init process by polling even when pidfds work (testing)")
	fs.BoolVar(&s.noContain, "no-contain", false, "start COMMAND without a cgroup of its own (by default: a systemd scope, or kc-watchman/<id> on cgroup v2 or the v1 freezer, swept at teardown)")
	return fs
}

func writeSuperviseHelp(w io.Writer) {
	io.WriteString(w, superviseHelp)
	writeOptions(w, new(superviseSettings).flagSet(), superviseEnv, "--help, -h\tshow this help")
}

func runSupervise(g *settings, args []string, stdout, stderr io.Writer) int {
	var s superviseSettings
	fs := s.flagSet()
	args, help, err := parse(fs, superviseEnv, args)
	if err != nil {
		return usageError(stderr, superviseCmd, err)
	}
	pos, command := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		pos, command = args[:i], args[i+1:]
	} else if len(args) > 3 {
		pos, command = args[:3], args[3:]
	}
	// Help is looked for among kc-hook's own arguments only: without "--",
	// COMMAND starts after the third, and a -h there is COMMAND's.
	if help || helpAsked(pos) {
		writeSuperviseHelp(stdout)
		return exitOK
	}
	spec, err := supervise.ParseArgs(pos, command)
	if err != nil {
		return usageError(stderr, superviseCmd, err)
	}
	sig, err := supervise.ParseSignal(s.pdeathsig)
	if err != nil {
		return usageError(stderr, superviseCmd, err)
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
		return usageError(stderr, superviseCmd, fmt.Errorf("--state-dir must be an absolute path, not %q", stateDir))
	}
	if s.maxRestarts < 0 {
		return usageError(stderr, superviseCmd, fmt.Errorf("--max-restarts must not be negative, not %d", s.maxRestarts))
	}
	if grace <= 0 {
		return usageError(stderr, superviseCmd, fmt.Errorf("--kill-grace must be positive, not %s", grace))
	}
	// Left to the library, a zero or negative one would silently become
	// its default.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"restart-delay", s.restartDelay}, {"max-restart-delay", s.maxRestartDelay}, {"stable-after", s.stableAfter},
		{"refresh", s.refresh}, {"init-poll", s.initPoll},
	} {
		if d.v <= 0 {
			return usageError(stderr, superviseCmd, fmt.Errorf("--%s must be positive, not %s", d.name, d.v))
		}
	}

	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: g.level})).With("container", spec.ContainerID, "wrapper_pid", os.Getpid())
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
		NoContain:       s.noContain,
		Contain:         contain.Options{Systemd: systemd.Scoper},
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
