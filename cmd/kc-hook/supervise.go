package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// superviseCommand runs a supervisor tied to a container's init process
// (the prevention layer, DESIGN §7). kc-hook starts it at createRuntime or
// poststart for containers annotated io.kc-watchman.supervisor=NAME, with
// the command taken from the allowlist; it can be run by hand too.
func superviseCommand() *cli.Command {
	return &cli.Command{
		Name:  "supervise",
		Usage: "run COMMAND as a supervisor that dies with the container's init process",
		UsageText: "kc-hook [--state-dir DIR] [--kill-grace D] supervise [options] CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...\n\n" +
			"Leads its own process group, runs COMMAND as its child (with a parent-death signal) and, when the\n" +
			"process INIT-PID with start time INIT-START-TICKS dies or on SIGTERM, takes the whole group down\n" +
			"(SIGTERM, --kill-grace, SIGKILL) and exits. Logs JSON lines to stderr.",
		Flags: []cli.Flag{
			// Also accepted after "supervise"; when absent there, the
			// global flags (and their environment variables) apply.
			&cli.StringFlag{Name: "state-dir", Usage: "ledger `DIR` for the group's snapshots", DefaultText: "the global --state-dir"},
			&cli.DurationFlag{Name: "kill-grace", Usage: "wait between SIGTERM and SIGKILL", DefaultText: "the global --kill-grace"},
			&cli.IntFlag{Name: "max-restarts", Value: supervise.DefaultMaxRestarts, Usage: "restarts of a COMMAND that exits before giving up (0: never restart)", EnvVars: []string{"KC_SUPERVISE_MAX_RESTARTS"}},
			&cli.DurationFlag{Name: "restart-delay", Value: supervise.DefaultRestartDelay, Usage: "first backoff before a restart; doubles per restart", EnvVars: []string{"KC_SUPERVISE_RESTART_DELAY"}},
			&cli.DurationFlag{Name: "max-restart-delay", Value: time.Minute, Usage: "cap on the backoff", EnvVars: []string{"KC_SUPERVISE_MAX_RESTART_DELAY"}},
			&cli.DurationFlag{Name: "stable-after", Value: 10 * time.Minute, Usage: "a COMMAND that ran this long gets its restart budget back", EnvVars: []string{"KC_SUPERVISE_STABLE_AFTER"}},
			&cli.StringFlag{Name: "pdeathsig", Value: supervise.SignalName(supervise.DefaultPdeathSig), Usage: "signal COMMAND gets if this wrapper dies (TERM, KILL, INT, HUP)", EnvVars: []string{"KC_SUPERVISE_PDEATHSIG"}},
			&cli.DurationFlag{Name: "refresh", Value: 10 * time.Second, Usage: "how often the ledger snapshot of the group is refreshed", EnvVars: []string{"KC_SUPERVISE_REFRESH"}},
			&cli.DurationFlag{Name: "init-poll", Value: 250 * time.Millisecond, Usage: "interval of identity polling when pidfds are unavailable", EnvVars: []string{"KC_SUPERVISE_INIT_POLL"}},
			&cli.BoolFlag{Name: "poll-init", Usage: "watch the init process by polling even when pidfds work (testing)", EnvVars: []string{"KC_SUPERVISE_POLL_INIT"}},
		},
		Action: func(c *cli.Context) error {
			return runSupervise(c)
		},
	}
}

const exitUsage = 2

func runSupervise(c *cli.Context) error {
	args := c.Args().Slice()
	pos, command := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		pos, command = args[:i], args[i+1:]
	} else if len(args) > 3 {
		pos, command = args[:3], args[3:]
	}
	spec, err := supervise.ParseArgs(pos, command)
	if err != nil {
		return cli.Exit("kc-hook supervise: "+err.Error(), exitUsage)
	}
	sig, err := supervise.ParseSignal(c.String("pdeathsig"))
	if err != nil {
		return cli.Exit("kc-hook supervise: "+err.Error(), exitUsage)
	}
	stateDir, grace := c.String("state-dir"), c.Duration("kill-grace")
	if !c.IsSet("state-dir") {
		stateDir = parentContext(c).String("state-dir")
	}
	if !c.IsSet("kill-grace") {
		grace = parentContext(c).Duration("kill-grace")
	}
	if stateDir != "" && !filepath.IsAbs(stateDir) {
		return cli.Exit(fmt.Sprintf("kc-hook supervise: --state-dir must be an absolute path, not %q", stateDir), exitUsage)
	}
	if c.Int("max-restarts") < 0 || grace <= 0 {
		return cli.Exit("kc-hook supervise: --max-restarts must not be negative and --kill-grace must be positive", exitUsage)
	}

	log := slog.New(slog.NewJSONHandler(c.App.ErrWriter, nil)).With("container", spec.ContainerID, "wrapper_pid", os.Getpid())
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
		MaxRestarts:     c.Int("max-restarts"),
		RestartDelay:    c.Duration("restart-delay"),
		MaxRestartDelay: c.Duration("max-restart-delay"),
		StableAfter:     c.Duration("stable-after"),
		PdeathSig:       sig,
		InitPoll:        c.Duration("init-poll"),
		ForcePoll:       c.Bool("poll-init"),
		Refresh:         c.Duration("refresh"),
		Logger:          log,
	})
	switch {
	case err == nil, errors.Is(err, supervise.ErrInitGone):
		return nil
	default:
		log.Error("supervise ended", "err", err)
		return cli.Exit(fmt.Sprintf("kc-hook supervise: %v", err), exitFailed)
	}
}

// parentContext is the context of the app-level flags.
func parentContext(c *cli.Context) *cli.Context {
	if l := c.Lineage(); len(l) > 1 {
		return l[1]
	}
	return c
}
