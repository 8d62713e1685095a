package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// Names of the global flags, given both to the app and to every command.
const (
	flagPodmanURL      = "podman-url"
	flagStateDir       = "state-dir"
	flagSupervisorComm = "supervisor-comm"
	flagFormat         = "format"
	flagLogFile        = "log-file"
	flagLogFormat      = "log-format"
	flagLogLevel       = "log-level"
	flagQuiet          = "quiet"
)

// defaultStateDir is where the hook of the same host user writes its
// ledger: /run/kc-watchman for root, /run/user/<uid>/kc-watchman for a
// rootless podman's user, whose hook cannot write root's. It reads the
// UID map: newApp asks once per run and hands the answer to every
// command's flags.
func defaultStateDir() string { return ledger.DefaultDir(userns.HostEUID()) }

func globalFlags(stateDir string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagPodmanURL, Usage: "podman API `URL` (unix:///path or tcp://); default: CONTAINER_HOST, else the rootful or rootless podman socket", EnvVars: []string{"KC_PODMAN_URL"}},
		&cli.StringFlag{Name: flagStateDir, Value: stateDir, Usage: "`DIR` holding kc-hook's ledger: this user's, not writable by others, no symlink, or the ledger is not used (default for a user other than root: /run/user/UID/kc-watchman)", EnvVars: []string{"KC_STATE_DIR"}},
		&cli.StringFlag{Name: flagSupervisorComm, Value: trees.DefaultComm, Usage: "comma-separated process `NAMES` (comm) that make a process group a supervisor tree", EnvVars: []string{"KC_SUPERVISOR_COMM"}},
		&cli.StringFlag{Name: flagFormat, Value: "text", Usage: "output `FORMAT`: text or json", EnvVars: []string{"KC_FORMAT"}},
		&cli.StringFlag{Name: flagLogFile, Usage: "also append logs to `FILE` (this user's, one link; no symlink)", EnvVars: []string{"KC_LOG_FILE"}},
		&cli.StringFlag{Name: flagLogFormat, Value: "text", Usage: "log `FORMAT`: text or json", EnvVars: []string{"KC_LOG_FORMAT"}},
		&cli.StringFlag{Name: flagLogLevel, Usage: "least `LEVEL` logged on stderr: debug, info, warn or error (default: info for watch; warn for the other commands, whose report on stdout holds every finding)", EnvVars: []string{"KC_LOG_LEVEL"}},
		&cli.BoolFlag{Name: flagQuiet, Aliases: []string{"q"}, Usage: "for cron: same as --log-level warn, and the report on stdout is left out unless something failed (findings still go to the log file)", EnvVars: []string{"KC_QUIET"}},
	}
}

// globals are the settings every command shares.
type globals struct {
	PodmanURL       string
	StateDir        string
	SupervisorComms []string
	JSON            bool
	LogFile         string
	LogJSON         bool
	// Engines is --engine parsed: nil for auto.
	Engines   []string
	DockerURL string
	// ContainerdAddress and ContainerdNamespaces: --containerd-address,
	// --containerd-namespace.
	ContainerdAddress    string
	ContainerdNamespaces []string
	// CRIEndpoint: --cri-endpoint.
	CRIEndpoint string
	// LogLevel is the least level logged on stderr; LevelSet says whether
	// --log-level or --quiet chose it.
	LogLevel slog.Level
	LevelSet bool
}

// Quiet reports whether only warnings and errors are wanted: a text
// report with nothing to act on is then not printed either.
func (g globals) Quiet() bool { return g.LevelSet && g.LogLevel >= slog.LevelWarn }

// reporting is g for a command whose stdout report already lists every
// finding: unless a level was asked for, stderr carries only warnings and
// errors, so a finding is not printed twice. The log file still gets
// every record.
func (g globals) reporting() globals {
	if !g.LevelSet {
		g.LogLevel = slog.LevelWarn
	}
	return g
}

// sharedString, sharedBool, sharedSlice and sharedDuration read a global
// flag given before or after the command name (cliapp.SharedString).
func sharedString(c *cli.Context, name string) string {
	// The app's flags are the global ones: only their environment
	// variables are read.
	return cliapp.SharedString(c, name, c.App.Flags)
}

func sharedBool(c *cli.Context, name string) bool { return cliapp.SharedBool(c, name, c.App.Flags) }

func sharedSlice(c *cli.Context, name string) []string {
	return cliapp.SharedSlice(c, name, c.App.Flags)
}

func sharedDuration(c *cli.Context, name string) time.Duration {
	return cliapp.SharedDuration(c, name, c.App.Flags)
}

func loadGlobals(c *cli.Context) (globals, error) {
	g := globals{
		PodmanURL: sharedString(c, flagPodmanURL),
		StateDir:  sharedString(c, flagStateDir),
		LogFile:   sharedString(c, flagLogFile),
	}
	switch f := sharedString(c, flagFormat); f {
	case "text":
	case "json":
		g.JSON = true
	default:
		return g, usageErr("--format must be text or json, not %q", f)
	}
	switch f := sharedString(c, flagLogFormat); f {
	case "text":
	case "json":
		g.LogJSON = true
	default:
		return g, usageErr("--log-format must be text or json, not %q", f)
	}
	if lvl := sharedString(c, flagLogLevel); lvl != "" {
		if err := g.LogLevel.UnmarshalText([]byte(lvl)); err != nil {
			return g, usageErr("--log-level must be debug, info, warn or error, not %q", lvl)
		}
		g.LevelSet = true
	}
	if sharedBool(c, flagQuiet) && (!g.LevelSet || g.LogLevel < slog.LevelWarn) {
		g.LogLevel, g.LevelSet = slog.LevelWarn, true
	}
	comms, err := trees.ParseComms(sharedString(c, flagSupervisorComm))
	if err != nil {
		return g, usageErr("--supervisor-comm: %v", err)
	}
	g.SupervisorComms = comms
	if g.StateDir == "" {
		return g, usageErr("--state-dir must not be empty")
	}
	if !filepath.IsAbs(g.StateDir) {
		// kc-hook refuses relative paths too: the two must name one dir
		// whatever each one's working directory.
		return g, usageErr("--state-dir must be an absolute path, not %q", g.StateDir)
	}
	if mf := sharedString(c, flagMetricsFile); mf != "" {
		if err := checkParentDir(mf); err != nil {
			return g, usageErr("--metrics-file: %v", err)
		}
	}
	if err := loadEngineGlobals(c, &g); err != nil {
		return g, err
	}
	return g, nil
}

// checkParentDir refuses a file whose directory does not exist: a typo in
// a unit or cron line must fail, not create a directory tree.
func checkParentDir(path string) error {
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%s: its directory %s does not exist (create it first)", path, dir)
	case !st.IsDir():
		return fmt.Errorf("%s: %s is not a directory", path, dir)
	}
	return nil
}

func usageErr(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), exitUsage)
}

// newLogger is the janitor's logger for g, appending to logFile too when
// it is set; a log file that cannot be opened is a usage error.
func newLogger(g globals, logFile string) (*slog.Logger, func(), error) {
	log, closer, err := janitor.NewLogger(janitor.Log{JSON: g.LogJSON, Level: g.LogLevel, File: logFile})
	if err != nil {
		return nil, nil, cli.Exit(err.Error(), exitUsage)
	}
	return log, closer, nil
}
