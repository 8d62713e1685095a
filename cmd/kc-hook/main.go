// Command kc-hook is an OCI hook (oci-hooks(5)) that records a container's
// init process when it is created and, when the container stops, reaps the
// supervisor trees left next to it.
//
// The runtime runs it with the container's State on stdin, the bundle as
// its working directory and, unless the descriptor sets env, an empty
// environment: every default below works without any.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/hook"
)

// version is set by the Makefile through -ldflags.
var version = "dev"

const (
	exitOK       = 0
	exitFailed   = 1
	exitBadInput = 2
)

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stderr))
}

func run(args []string, stdin io.Reader, stderr io.Writer) int {
	code := exitOK
	app := &cli.App{
		Name:      "kc-hook",
		Usage:     "OCI hook: record a container's init process, reap its supervisor trees when it stops",
		UsageText: "kc-hook [options] STAGE < state.json\n\nSTAGE is createRuntime (or its old name prestart), createContainer, startContainer, poststart or poststop.",
		Version:   version,
		Writer:    stderr,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Value: "/run/kc-watchman", Usage: "ledger `DIR`", EnvVars: []string{"KC_STATE_DIR"}},
			&cli.StringFlag{Name: "supervisor-comm", Value: "kcserver", Usage: "comma-separated supervisor process `NAMES`", EnvVars: []string{"KC_SUPERVISOR_COMM"}},
			&cli.DurationFlag{Name: "kill-grace", Value: 5 * time.Second, Usage: "wait between SIGTERM and SIGKILL", EnvVars: []string{"KC_KILL_GRACE"}},
			&cli.DurationFlag{Name: "deadline", Value: 20 * time.Second, Usage: "bound on a whole poststop run; keep it below the descriptor's timeout", EnvVars: []string{"KC_HOOK_DEADLINE"}},
			&cli.StringFlag{Name: "log-file", Usage: "JSON-lines log `FILE` (default: STATE-DIR/kc-hook.log)", EnvVars: []string{"KC_HOOK_LOG"}},
			&cli.StringFlag{Name: "supervisors-file", Value: "/etc/kc-watchman/supervisors.json", Usage: "root-owned allowlist `FILE` of the supervisors the io.kc-watchman.supervisor annotation may name", EnvVars: []string{"KC_SUPERVISORS_FILE"}},
		},
		Commands:        []*cli.Command{superviseCommand()},
		HideHelpCommand: true,
		// A bad flag is one line on stderr (DESIGN §6), not the whole usage.
		OnUsageError:   func(_ *cli.Context, err error, _ bool) error { return err },
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			code = runStage(c, stdin, stderr)
			return nil
		},
	}
	if err := app.Run(args); err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) { // kc-hook supervise
			fmt.Fprintln(stderr, err)
			return ec.ExitCode()
		}
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}
	return code
}

func runStage(c *cli.Context, stdin io.Reader, stderr io.Writer) int {
	if c.NArg() != 1 {
		fmt.Fprintln(stderr, "kc-hook: exactly one STAGE argument is required (see --help)")
		return exitBadInput
	}
	stage, err := hook.ParseStage(c.Args().First())
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}
	if c.Duration("kill-grace") <= 0 || c.Duration("deadline") <= 0 {
		fmt.Fprintln(stderr, "kc-hook: --kill-grace and --deadline must be positive")
		return exitBadInput
	}
	comms, err := checkCommon(c)
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}
	st, err := hook.ReadState(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}

	// Only now, with usable input, may anything be written.
	cfg := hook.Config{
		StateDir:        c.String("state-dir"),
		Comms:           comms,
		KillGrace:       c.Duration("kill-grace"),
		Deadline:        c.Duration("deadline"),
		SupervisorsFile: c.String("supervisors-file"),
	}
	logger, closeLog := openLog(cfg.StateDir, c.String("log-file"), stderr)
	defer closeLog()
	cfg.Logger = logger.With("container", st.ID, "stage", string(stage))

	if stage != hook.StagePoststop {
		if err := hook.Record(cfg, stage, st); err != nil {
			// A hook must never stop a container from starting.
			cfg.Logger.Error("bookkeeping failed; the container starts anyway", "err", err)
		} else {
			cfg.Logger.Info("recorded", "pid", st.Pid)
		}
		return exitOK
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
	defer cancel()
	start := time.Now()
	res, err := hook.Poststop(ctx, cfg, st)
	cfg.Logger.Info("poststop done", "trees", len(res.Trees), "failed", res.Failed, "duration_ms", time.Since(start).Milliseconds(), "err", err)
	switch {
	case res.Failed:
		fmt.Fprintf(stderr, "kc-hook: a supervisor tree of container %.12s would not die; kc-janitor reconcile will retry\n", st.ID)
		return exitFailed
	case err != nil && len(res.Trees) == 0 && !errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitFailed
	}
	return exitOK
}

// checkCommon validates the settings every stage uses and returns the
// supervisor names. Paths must be absolute: the runtime runs hooks with
// the bundle as working directory, where a relative ledger would be lost
// with the container.
func checkCommon(c *cli.Context) ([]string, error) {
	if sd := c.String("state-dir"); !filepath.IsAbs(sd) {
		return nil, fmt.Errorf("--state-dir must be an absolute path, not %q (hooks run in the bundle directory)", sd)
	}
	if lf := c.String("log-file"); lf != "" && !filepath.IsAbs(lf) {
		return nil, fmt.Errorf("--log-file must be an absolute path, not %q (hooks run in the bundle directory)", lf)
	}
	comms := splitComms(c.String("supervisor-comm"))
	if len(comms) == 0 {
		return nil, errors.New("--supervisor-comm names no process")
	}
	for _, name := range comms {
		if len(name) > 15 {
			return nil, fmt.Errorf("--supervisor-comm: %q is longer than the 15 bytes the kernel keeps of a process name", name)
		}
	}
	return comms, nil
}

func splitComms(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// openLog opens the JSON-lines log, creating the state dir if needed. When
// it cannot, logs go to stderr, which the runtime keeps.
func openLog(stateDir, path string, stderr io.Writer) (*slog.Logger, func()) {
	if path == "" {
		path = filepath.Join(stateDir, "kc-hook.log")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			return slog.New(slog.NewJSONHandler(f, nil)), func() { f.Close() }
		}
	}
	return slog.New(slog.NewJSONHandler(stderr, nil)), func() {}
}
