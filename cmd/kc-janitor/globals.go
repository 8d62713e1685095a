package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
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

// envValue returns the value the environment gives the global flag name.
func envValue(name string) (string, bool) {
	for _, f := range globalFlags() {
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
	comms, err := parseComms(sharedString(c, flagSupervisorComm))
	if err != nil {
		return g, usageErr("--supervisor-comm: %v", err)
	}
	g.SupervisorComms = comms
	if g.StateDir == "" {
		return g, usageErr("--state-dir must not be empty")
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

// newLogger logs to stderr and, when logFile is set, to that file too.
// The returned closer closes the file.
func newLogger(g globals, logFile string) (*slog.Logger, func(), error) {
	var w io.Writer = os.Stderr
	closer := func() {}
	if logFile != "" {
		f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, nil, cli.Exit(fmt.Sprintf("cannot open log file: %v", err), exitUsage)
		}
		w = io.MultiWriter(os.Stderr, f)
		closer = func() { f.Close() }
	}
	var h slog.Handler
	if g.LogJSON {
		h = slog.NewJSONHandler(w, nil)
	} else {
		h = slog.NewTextHandler(w, nil)
	}
	return slog.New(h), closer, nil
}
