package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
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
// rootless podman's user, whose hook cannot write root's.
func defaultStateDir() string { return ledger.DefaultDir(userns.HostEUID()) }

// DefaultSupervisorComm is the comm of Kallichore's supervisor.
const DefaultSupervisorComm = "kcserver"

func globalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagPodmanURL, Usage: "podman API `URL` (unix:///path or tcp://); default: CONTAINER_HOST, else the rootful or rootless podman socket", EnvVars: []string{"KC_PODMAN_URL"}},
		&cli.StringFlag{Name: flagStateDir, Value: defaultStateDir(), Usage: "`DIR` holding kc-hook's ledger (default for a user other than root: /run/user/UID/kc-watchman)", EnvVars: []string{"KC_STATE_DIR"}},
		&cli.StringFlag{Name: flagSupervisorComm, Value: DefaultSupervisorComm, Usage: "comma-separated process `NAMES` (comm) that make a process group a supervisor tree", EnvVars: []string{"KC_SUPERVISOR_COMM"}},
		&cli.StringFlag{Name: flagFormat, Value: "text", Usage: "output `FORMAT`: text or json", EnvVars: []string{"KC_FORMAT"}},
		&cli.StringFlag{Name: flagLogFile, Usage: "also append logs to `FILE`", EnvVars: []string{"KC_LOG_FILE"}},
		&cli.StringFlag{Name: flagLogFormat, Value: "text", Usage: "log `FORMAT`: text or json", EnvVars: []string{"KC_LOG_FORMAT"}},
		&cli.StringFlag{Name: flagLogLevel, Usage: "least `LEVEL` logged on stderr: debug, info, warn or error (default: info for watch; warn for the other commands, whose report on stdout holds every finding)", EnvVars: []string{"KC_LOG_LEVEL"}},
		&cli.BoolFlag{Name: flagQuiet, Aliases: []string{"q"}, Usage: "same as --log-level warn; a run with nothing to report then prints nothing (for cron)", EnvVars: []string{"KC_QUIET"}},
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

// sharedString resolves a global flag given either after the command name
// (the command's own copy) or before it (the app's copy); urfave/cli/v2
// would otherwise only ever see the command's copy. A flag typed on the
// command line beats the environment at either position: urfave/cli
// reports both as "set", so a copy whose value differs from the
// environment's is the one the user typed.
func sharedString(c *cli.Context, name string) string {
	env, fromEnv := envValue(name)
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) && (!fromEnv || lc.String(name) != env) {
			return lc.String(name)
		}
	}
	return c.String(name)
}

// sharedBool is sharedString for a boolean global flag: set at either
// position.
func sharedBool(c *cli.Context, name string) bool {
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) && lc.Bool(name) {
			return true
		}
	}
	return false
}

// envValue returns the value the environment gives the global flag name.
func envValue(name string) (string, bool) {
	for _, f := range append(globalFlags(), engineFlags()...) {
		sf, ok := f.(*cli.StringFlag)
		if !ok || sf.Name != name {
			continue
		}
		for _, ev := range sf.EnvVars {
			if v, ok := os.LookupEnv(ev); ok {
				return v, true
			}
		}
	}
	return "", false
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
	comms, err := parseComms(sharedString(c, flagSupervisorComm))
	if err != nil {
		return g, usageErr("--supervisor-comm: %v", err)
	}
	g.SupervisorComms = comms
	if g.StateDir == "" {
		return g, usageErr("--state-dir must not be empty")
	}
	if err := loadEngineGlobals(c, &g); err != nil {
		return g, err
	}
	return g, nil
}

// parseComms splits a comma-separated comm list. The kernel truncates comm
// to 15 bytes, so a longer name could never match.
func parseComms(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if len(p) > 15 {
			return nil, fmt.Errorf("%q is longer than the 15 bytes the kernel keeps of a process name", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process names given")
	}
	return out, nil
}

func usageErr(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), exitUsage)
}

// newLogger logs to stderr at g.LogLevel and, when logFile is set, to that
// file too, at info or below whatever stderr gets: the file is the audit
// record of every run. Missing parent directories of the file are created.
// When stderr is the journal (JOURNAL_STREAM set), its lines carry no
// time: journald stamps them. The returned closer closes the file.
func newLogger(g globals, logFile string) (*slog.Logger, func(), error) {
	stderr := newHandler(g.LogJSON, os.Stderr, g.LogLevel, os.Getenv("JOURNAL_STREAM") != "")
	closer := func() {}
	if logFile == "" {
		return slog.New(stderr), closer, nil
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o750); err != nil {
		return nil, nil, cli.Exit(fmt.Sprintf("cannot create the log file's directory: %v", err), exitUsage)
	}
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, nil, cli.Exit(fmt.Sprintf("cannot open log file: %v", err), exitUsage)
	}
	closer = func() { f.Close() }
	file := newHandler(g.LogJSON, f, min(g.LogLevel, slog.LevelInfo), false)
	return slog.New(slog.NewMultiHandler(stderr, file)), closer, nil
}

// newHandler is a text or JSON handler writing records at level or above.
// Durations are written as Go durations ("1m30s") in text and as seconds
// in JSON, never as nanoseconds.
func newHandler(json bool, w io.Writer, level slog.Level, noTime bool) slog.Handler {
	opts := &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if noTime && len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			if a.Value.Kind() == slog.KindDuration {
				d := a.Value.Duration()
				if json {
					return slog.Float64(a.Key+"_seconds", d.Seconds())
				}
				return slog.String(a.Key, d.String())
			}
			return a
		},
	}
	if json {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}
