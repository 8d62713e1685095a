// Command kc-hook is an OCI hook (oci-hooks(5)) that records a container's
// init process when it is created and, when the container stops, reaps the
// supervisor trees left next to it.
//
// The runtime runs it with the container's State on stdin, the bundle as
// its working directory and, unless the descriptor sets env, an empty
// environment: every default below works without any.
//
// The command line is parsed with the standard library's flag package, not
// urfave/cli as kc-janitor's is: kc-hook runs in every container's start
// and stop path, and urfave/cli, with the template and markdown packages it
// pulls in, was over a third of the binary's start-up time. The behaviour
// is the one urfave/cli gave it — flags before the STAGE, each flag's
// environment variable below the flag and above the default, the same
// messages, help pages and exit statuses — so nothing that runs or tests
// kc-hook sees a difference.
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

	"github.com/kc-watchman/kc-watchman/internal/hook"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// version is set by the Makefile through -ldflags.
var version = "dev"

const (
	exitOK       = 0
	exitFailed   = 1
	exitBadInput = 2
	// exitNoTopic is what urfave/cli answered `--help NAME` with when NAME
	// was no command; kept so that nothing changes for a caller.
	exitNoTopic = 3
)

const (
	hookName      = "kc-hook"
	hookUsage     = "OCI hook: record a container's init process, reap its supervisor trees when it stops"
	hookUsageText = "kc-hook [options] STAGE < state.json\n\n" +
		"STAGE is createRuntime (or its old name prestart), createContainer, startContainer, poststart or poststop."
)

// settings are the global options, after flags and environment.
type settings struct {
	stateDir        string
	supervisorComm  string
	killGrace       time.Duration
	deadline        time.Duration
	logFile         string
	supervisorsFile string
}

func (s *settings) options() []option {
	return []option{
		{name: "state-dir", env: "KC_STATE_DIR", meta: "DIR", usage: "ledger DIR", str: &s.stateDir, strDef: "/run/kc-watchman"},
		{name: "supervisor-comm", env: "KC_SUPERVISOR_COMM", meta: "NAMES", usage: "comma-separated supervisor process NAMES", str: &s.supervisorComm, strDef: "kcserver"},
		{name: "kill-grace", env: "KC_KILL_GRACE", usage: "wait between SIGTERM and SIGKILL", dur: &s.killGrace, durDef: 5 * time.Second},
		{name: "deadline", env: "KC_HOOK_DEADLINE", usage: "bound on a whole poststop run; keep it below the descriptor's timeout", dur: &s.deadline, durDef: 20 * time.Second},
		{name: "log-file", env: "KC_HOOK_LOG", meta: "FILE", usage: "JSON-lines log FILE (default: STATE-DIR/kc-hook.log)", str: &s.logFile},
		{name: "supervisors-file", env: "KC_SUPERVISORS_FILE", meta: "FILE", usage: "root-owned allowlist FILE of the supervisors the io.kc-watchman.supervisor annotation may name", str: &s.supervisorsFile, strDef: supervise.DefaultAllowlistFile},
	}
}

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stderr))
}

// commandLine is kc-hook's command line before STAGE or "supervise".
type commandLine struct {
	settings
	help, version bool
	args          []string // STAGE, or "supervise" and its arguments
}

// parseCommandLine parses the global options in args (without the
// program name), each flag over its environment variable over its default.
// Parsing stops at the first argument that is not a flag: flags after
// STAGE were never accepted.
func parseCommandLine(args []string) (*commandLine, error) {
	cl := &commandLine{}
	opts := cl.options()
	fs, err := newFlagSet(opts)
	if err != nil {
		return nil, err
	}
	if err := parse(fs, opts, args); err != nil {
		return nil, err
	}
	cl.args = fs.Args()
	return cl, nil
}

func (cl *commandLine) options() []option {
	opts := append(cl.settings.options(), helpOption(&cl.help))
	// A build without a version has no --version, as under urfave/cli.
	if version != "" {
		opts = append(opts, versionOption(&cl.version))
	}
	return opts
}

// run is the whole command. Everything it prints goes to stderr, help and
// version included, as it always has: whoever reads them reads stderr.
func run(args []string, stdin io.Reader, stderr io.Writer) int {
	cl, err := parseCommandLine(args[1:])
	if err != nil {
		// A bad flag is one line on stderr (DESIGN §6), not the whole usage.
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}
	rest := cl.args
	switch {
	case cl.help:
		if len(rest) == 0 {
			io.WriteString(stderr, hookHelp())
			return exitOK
		}
		if rest[0] != superviseName {
			fmt.Fprintf(stderr, "No help topic for '%v'\n", rest[0])
			return exitNoTopic
		}
		io.WriteString(stderr, superviseHelp(false))
		return exitOK
	case cl.version:
		fmt.Fprintf(stderr, "%s version %s\n", hookName, version)
		return exitOK
	case len(rest) > 0 && rest[0] == superviseName:
		return runSupervise(&cl.settings, rest[1:], stderr)
	}
	return runStage(&cl.settings, rest, stdin, stderr)
}

func hookHelp() string {
	var cl commandLine
	var b strings.Builder
	fmt.Fprintf(&b, "NAME:\n   %s - %s\n\n", hookName, hookUsage)
	fmt.Fprintf(&b, "USAGE:\n%s\n\n", indent(hookUsageText))
	if version != "" {
		fmt.Fprintf(&b, "VERSION:\n   %s\n\n", version)
	}
	fmt.Fprintf(&b, "COMMANDS:\n   %s  %s\n\n", superviseName, superviseUsage)
	b.WriteString("GLOBAL OPTIONS:\n")
	b.WriteString(optionLines(cl.options()))
	return b.String()
}

func runStage(s *settings, args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "kc-hook: exactly one STAGE argument is required (see --help)")
		return exitBadInput
	}
	stage, err := hook.ParseStage(args[0])
	if err != nil {
		fmt.Fprintln(stderr, "kc-hook:", err)
		return exitBadInput
	}
	if s.killGrace <= 0 || s.deadline <= 0 {
		fmt.Fprintln(stderr, "kc-hook: --kill-grace and --deadline must be positive")
		return exitBadInput
	}
	comms, err := checkCommon(s)
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
		StateDir:        s.stateDir,
		Comms:           comms,
		KillGrace:       s.killGrace,
		Deadline:        s.deadline,
		SupervisorsFile: s.supervisorsFile,
	}
	logger, closeLog := openLog(cfg.StateDir, s.logFile, stderr)
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
func checkCommon(s *settings) ([]string, error) {
	if sd := s.stateDir; !filepath.IsAbs(sd) {
		return nil, fmt.Errorf("--state-dir must be an absolute path, not %q (hooks run in the bundle directory)", sd)
	}
	if lf := s.logFile; lf != "" && !filepath.IsAbs(lf) {
		return nil, fmt.Errorf("--log-file must be an absolute path, not %q (hooks run in the bundle directory)", lf)
	}
	comms := splitComms(s.supervisorComm)
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
