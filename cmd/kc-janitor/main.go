// Command kc-janitor reconciles a container host against its container
// engines' view of which containers are alive: it reaps stray supervisor
// trees, sweeps orphan Kallichore sockets and audits abandoned kernel
// sessions. It is read-only unless told otherwise.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/oneshot"
)

// Exit codes shared by the commands (DESIGN "The outside").
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitUnknown = 3
)

// version is set by the Makefile through -ldflags.
var version = "dev"

// The main goroutine keeps the main thread, so that no other goroutine
// runs there: pgkill signals a tree's group from a thread that takes the
// tree's UID, which must be one the runtime can end (see pgkill).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(run(os.Args))
}

func run(args []string) int {
	app := newApp()
	err := runApp(app, args)
	if err == nil {
		return exitOK
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		// urfave/cli's help command exits 3 on a topic it does not know:
		// here 3 means "ground truth unknown", which alerts page on.
		if topic, ok := strings.CutPrefix(err.Error(), "No help topic for '"); ok && ec.ExitCode() == exitUnknown {
			fmt.Fprintln(os.Stderr, "kc-janitor:", cliapp.UnknownCommand(app, strings.TrimSuffix(topic, "'")))
			return exitUsage
		}
		if msg := err.Error(); msg != "" {
			if ec.ExitCode() == exitUsage {
				msg = cliapp.FromEnv(app, args[1:], msg)
			}
			fmt.Fprintln(os.Stderr, "kc-janitor:", msg)
		}
		return ec.ExitCode()
	}
	// Anything urfave/cli reports on its own is a usage error: unknown
	// flag, bad value, missing argument.
	fmt.Fprintln(os.Stderr, "kc-janitor:", cliapp.UsageMessage(err, app.Commands))
	return exitUsage
}

// tunedCommand names the commands that do one job and exit with memory
// the host's process table bounds: watch runs on (and --once sweeps), and
// sweep's and cull's memory follows what other users' sockets answer.
func tunedCommand(command string) bool { return command == "reconcile" || command == "status" }

// tuned runs a command without the garbage collector (oneshot.Tune).
func tuned(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		oneshot.Tune()
		return action(c)
	}
}

// runApp runs app on args as the binary does: a completion request is
// answered without running anything, bare numbers given to duration flags
// mean seconds, then the app runs.
func runApp(app *cli.App, args []string) error {
	if words, ok := cliapp.Words(args); ok {
		app.Setup() // the writers, the help command and flag
		cliapp.Complete(app.Writer, app, words, flagValues, flagLists)
		return nil
	}
	if cmd, ok := cliapp.VersionWithCommand(app, args[1:]); ok {
		msg := fmt.Sprintf("--version (-v) prints the version and runs no command, yet %s follows it (more logs: --log-level debug)", cmd)
		auditParseError(cmd, msg)
		return cli.Exit(msg, exitUsage)
	}
	// An error in a flag typed before the command name is the app's to
	// report; the run it stopped still leaves its audit line.
	if cmd := cliapp.CommandIn(app, args[1:]); cmd != "" && app.OnUsageError != nil {
		report := app.OnUsageError
		app.OnUsageError = func(c *cli.Context, err error, sub bool) error {
			e := report(c, err, sub)
			auditParseError(cmd, e.Error())
			return e
		}
	}
	// What the operator typed, for the checks that tell a flag from its
	// variable (watch's --format, the audit line's wording).
	if app.Metadata == nil {
		app.Metadata = map[string]any{}
	}
	app.Metadata[typedArgs] = args[1:]
	return app.Run(cliapp.NormalizeDurations(app, args))
}

// typedArgs is the App.Metadata key of the command line, without the
// program's name.
const typedArgs = "typed-args"

// commandLine is the command line run was given, without the program's
// name.
func commandLine(c *cli.Context) []string {
	args, _ := c.App.Metadata[typedArgs].([]string)
	return args
}

func newApp() *cli.App {
	// --version and the version command print the same line.
	cli.VersionPrinter = func(c *cli.Context) { printVersion(c, false) }
	cliapp.InstallHelp()
	stateDir := defaultStateDir()
	return &cli.App{
		Name:    "kc-janitor",
		Usage:   "reap what container supervisors leave behind, with the container engines (podman, Docker, containerd, CRI) as ground truth",
		Version: version,
		Description: `kc-janitor finds supervisor process trees whose container is gone,
orphan kc-*.sock sockets and abandoned kernel sessions. Every command is a
dry run unless --apply (or its environment variable) is given; cull never
kills anything. Every flag can also be set through the KC_* environment
variable shown next to it, and global flags may come before or after the
command name.`,
		Flags:          append(append(globalFlags(stateDir), engineFlags()...), metricsFlags()...),
		Commands:       commands(stateDir),
		HideVersion:    false,
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return cli.Exit(cliapp.UsageMessageIn(c, err, commands(stateDir)), exitUsage)
		},
		// Reached only when the first word is no command: a typo in a
		// cron line must not exit 3, which means "podman down".
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return cli.ShowAppHelp(c)
			}
			return usageErr("%s", cliapp.UnknownCommand(c.App, c.Args().First()))
		},
	}
}

// commands is the list of subcommands; each lives in its own file.
// stateDir is --state-dir's default.
func commands(stateDir string) []*cli.Command {
	cmds := []*cli.Command{
		reconcileCommand(),
		sweepCommand(),
		cullCommand(),
		doctorCommand(),
		statusCommand(),
		watchCommand(),
		versionCommand(),
		manCommand(),
		configDocCommand(),
		completionCommand(),
		installHookCommand(),
	}
	global := map[string]bool{}
	for _, f := range append(append(globalFlags(stateDir), engineFlags()...), metricsFlags()...) {
		global[f.Names()[0]] = true
	}
	for _, c := range cmds {
		withExitStatus(c)
		c.Flags = append(c.Flags, globalFlags(stateDir)...)
		c.Flags = append(c.Flags, engineFlags()...)
		c.Flags = append(c.Flags, metricsFlags()...)
		ownHelp(c, global)
		// urfave/cli's own help subcommand would answer a malformed flag
		// after it ("reconcile help --x") with its help and "Incorrect
		// Usage" on stdout; helpArg keeps "reconcile help" working.
		c.HideHelpCommand = true
		if c.Action != nil {
			c.Action = withAudit(c.Name, helpArg(noStrayArgs(withMetrics(c.Name, c.Action))))
			if tunedCommand(c.Name) {
				c.Action = tuned(c.Action)
			}
		}
		if c.OnUsageError == nil {
			name := c.Name
			c.OnUsageError = func(c *cli.Context, err error, _ bool) error {
				msg := cliapp.UsageMessageIn(c, err, commands(stateDir))
				auditParseError(name, msg)
				return cli.Exit(msg, exitUsage)
			}
		}
	}
	return cmds
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			// It takes the global flags like every command; a malformed
			// one is an error here too, not silently ignored.
			se, err := preamble(c, "version", plan{noReport: true})
			if err != nil {
				return err
			}
			se.close()
			printVersion(c, se.g.JSON)
			return nil
		},
	}
}

// printVersion prints "kc-janitor VERSION", or {"version": VERSION}.
func printVersion(c *cli.Context, json bool) {
	if json {
		writeJSON(c.App.Writer, map[string]string{"name": "kc-janitor", "version": version})
		return
	}
	fmt.Fprintln(c.App.Writer, "kc-janitor", version)
}
