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
// pulls in, was over a third of the binary's start-up time. Flags go
// before STAGE, each flag's environment variable sits below the flag and
// above the default, and every usage error is one line and exit status 2
// (in a pre-start stage, exit status 0: see settingsError).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/contain/systemd"
	"github.com/kc-watchman/kc-watchman/internal/hook"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/logkeys"
	"github.com/kc-watchman/kc-watchman/internal/oneshot"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// version is set by the Makefile through -ldflags.
var version = "dev"

const (
	exitOK       = 0
	exitFailed   = 1
	exitBadInput = 2
)

const (
	hookName = "kc-hook"
	hookHelp = `Usage: kc-hook [options] STAGE < state.json
       kc-hook [options] supervise [supervise options]
               CONTAINER-ID INIT-PID INIT-START-TICKS -- COMMAND...
       kc-hook --check-settings [options] STAGE

OCI hook: record a container's init process, reap its supervisor trees when
it stops. The runtime runs it with the container's State on stdin.
STAGE is createRuntime (or its old name prestart), createContainer,
startContainer, poststart or poststop.

Exit codes: a pre-start stage exits 0 on input, options or variables it
cannot use, so that no container fails to start: it says why on stderr
and in a trace file kc-janitor doctor reads (/run/kc-watchman.trace;
another user's /run/user/UID/kc-hook.trace, else the temp dir's
kc-hook-UID.trace). An unknown STAGE is 2 in every stage. poststop exits
2 on unusable input or options, 1 when a tree would not die or /proc
could not be scanned.

Commands:
   supervise  run COMMAND as a supervisor that dies with the container's
              init process (see kc-hook supervise --help)
   version    print the version, as --version does

Options:
`
)

// settings are the global options, after flags and environment.
type settings struct {
	stateDir        string
	supervisorComm  string
	killGrace       time.Duration
	deadline        time.Duration
	logFile         string
	supervisorsFile string
	bpf             string
	logLevel        string
	quiet           bool
	// level is logLevel and quiet resolved: what the logs keep.
	level slog.Level
}

// hookEnv names the environment variable of each global flag.
var hookEnv = map[string]string{
	"state-dir":        "KC_STATE_DIR",
	"supervisor-comm":  "KC_SUPERVISOR_COMM",
	"kill-grace":       "KC_KILL_GRACE",
	"deadline":         "KC_HOOK_DEADLINE",
	"log-file":         "KC_HOOK_LOG",
	"supervisors-file": "KC_SUPERVISORS_FILE",
	"bpf":              "KC_BPF",
	"log-level":        "KC_LOG_LEVEL",
	"quiet":            "KC_QUIET",
	"q":                "KC_QUIET",
}

// commandLine is kc-hook's command line before STAGE or "supervise".
type commandLine struct {
	settings
	help, version bool
	args          []string // STAGE, or "supervise" and its arguments
}

func (cl *commandLine) flagSet() *flag.FlagSet {
	fs := newFlagSet(hookName)
	// Rootless podman runs hooks as root of its user namespace: the
	// default follows the host UID, which /proc/self/uid_map gives.
	fs.StringVar(&cl.stateDir, "state-dir", ledger.DefaultDir(userns.HostEUID()), "ledger `DIR`: this user's, not writable by others, no symlink, or not used")
	fs.StringVar(&cl.supervisorComm, "supervisor-comm", trees.DefaultComm, "comma-separated supervisor process `NAMES`")
	fs.DurationVar(&cl.killGrace, "kill-grace", pgkill.DefaultGrace, "wait between SIGTERM and SIGKILL")
	fs.DurationVar(&cl.deadline, "deadline", 20*time.Second, "bound on a whole stage (past it, a pre-start stage gives up with exit 0, poststop with 1 two seconds later); keep it below the descriptor's timeout, by more than 2s for poststop (kc-janitor doctor checks)")
	fs.StringVar(&cl.logFile, "log-file", "", "JSON-lines log `FILE` (default: STATE-DIR/kc-hook.log)")
	fs.StringVar(&cl.supervisorsFile, "supervisors-file", supervise.DefaultAllowlistFile, "root-owned allowlist `FILE` of the supervisors the io.kc-watchman.supervisor annotation may name")
	fs.StringVar(&cl.bpf, "bpf", "auto", "list processes through a BPF task iterator, `MODE` auto (where the kernel allows it, else /proc), on (fail without it) or off (never load a BPF program)")
	fs.StringVar(&cl.logLevel, "log-level", "info", "least `LEVEL` logged: debug, info, warn or error")
	fs.BoolVar(&cl.quiet, "quiet", false, "same as --log-level warn (also -q)")
	fs.BoolVar(&cl.quiet, "q", false, "")
	// No usage: writeHookHelp lists both names on one line.
	fs.BoolVar(&cl.version, "version", false, "")
	fs.BoolVar(&cl.version, "v", false, "")
	return fs
}

func writeHookHelp(w io.Writer) {
	io.WriteString(w, hookHelp)
	writeOptions(w, new(commandLine).flagSet(), hookEnv, "--help, -h\tshow this help", "--version, -v\tprint the version",
		checkSettingsFlag+"\tfirst on the line: only judge the options, variables and STAGE after it and print \"settings ok\" (exit 0) or \"settings refused: WHY\" (exit 2); kc-janitor doctor runs this")
}

// The main goroutine keeps the main thread, so that no other goroutine
// runs there: pgkill signals a tree's group from a thread that takes the
// tree's UID, which must be one the runtime can end (see pgkill).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// parseCommandLine parses the global options in args (without the program
// name). Parsing stops at STAGE: flags after it are refused as extra
// arguments, and supervise's flags are its own.
func parseCommandLine(args []string) (*commandLine, error) {
	cl := &commandLine{}
	rest, help, err := parse(cl.flagSet(), hookEnv, args)
	if err != nil {
		return nil, err
	}
	cl.args = rest
	if err := cl.level.UnmarshalText([]byte(cl.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level must be debug, info, warn or error, not %q", cl.logLevel)
	}
	if cl.quiet && cl.level < slog.LevelWarn {
		cl.level = slog.LevelWarn
	}
	// A -h after "supervise" is supervise's.
	cl.help = help || (!cl.supervise() && helpAsked(rest))
	return cl, nil
}

func (cl *commandLine) supervise() bool {
	return len(cl.args) > 0 && cl.args[0] == superviseName
}

// run is the whole command. Help and version go to stdout; errors and
// logs to stderr, which the runtime keeps.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 1 && args[1] == checkSettingsFlag {
		return checkSettings(args[2:], stdout)
	}
	cl, err := parseCommandLine(args[1:])
	switch {
	case err != nil:
		return settingsError(stderr, args[1:], "", err)
	case cl.help:
		writeHookHelp(stdout)
		return exitOK
	case cl.version || len(cl.args) == 1 && cl.args[0] == "version":
		// "NAME VERSION", as kc-janitor prints it.
		fmt.Fprintln(stdout, hookName, version)
		return exitOK
	case cl.supervise():
		return runSupervise(&cl.settings, cl.args[1:], stdout, stderr)
	}
	return runStage(&cl.settings, cl.args, args[1:], stdin, stderr)
}

// stageRun is what a stage runs with, once its settings are checked.
type stageRun struct {
	stage  hook.Stage
	comms  []string
	lister proctable.Lister
	// until is when a pre-start stage gives up (hook.Config.Until).
	until time.Time
}

// checkStage validates a stage's arguments and settings. A STAGE kc-hook
// does not know wraps hook.ErrUnknownStage.
func checkStage(s *settings, args []string) (stageRun, error) {
	var r stageRun
	if len(args) != 1 {
		return r, fmt.Errorf("want one STAGE after the options, got %q", args)
	}
	var err error
	if r.stage, err = hook.ParseStage(args[0]); err != nil {
		return r, err
	}
	if s.killGrace <= 0 || s.deadline <= 0 {
		return r, errors.New("--kill-grace and --deadline must be positive")
	}
	if r.comms, err = checkCommon(s); err != nil {
		return r, err
	}
	if r.lister, err = proctable.ParseLister(s.bpf); err != nil {
		return r, fmt.Errorf("--bpf: %w", err)
	}
	return r, nil
}

// runStage runs the stage args name; all is the whole command line after
// the program name, for settingsError: a string option left without its
// value takes the stage name for it (args is then empty), and the stage
// is found in all.
func runStage(s *settings, args, all []string, stdin io.Reader, stderr io.Writer) int {
	r, err := checkStage(s, args)
	stage := r.stage
	switch {
	case errors.Is(err, hook.ErrUnknownStage):
		// Unknown in every stage, so a usage error in every stage.
		return usageError(stderr, hookName, err)
	case err != nil:
		return settingsError(stderr, all, s.stateDir, err)
	}
	oneshot.Tune()
	if f, ok := stdin.(*os.File); ok && isTerminal(f) {
		// A person typed the command: the State would be awaited forever.
		return usageError(stderr, hookName, errors.New("stdin is a terminal: the runtime passes the container's State (JSON) on stdin; by hand: echo '{\"id\":\"<64 hex>\",\"status\":\"stopped\"}' | kc-hook poststop"))
	}
	if stage == hook.StagePoststop {
		return poststop(s, r, stdin, stderr)
	}
	return preStart(s, r, stdin, stderr)
}

// poststopGrace is how long past --deadline poststop may run before the
// hook gives up on it: the deadline bounds its signals and waits, and
// what it cannot bound (a State never written, a read of /proc a user's
// file system holds) must not hold the hook until the runtime's timeout.
const poststopGrace = 2 * time.Second

// poststop runs the poststop stage and exits 1 if it is still running
// poststopGrace after --deadline: kc-janitor reconcile takes over what it
// left, and main's exit ends what is still running.
func poststop(s *settings, r stageRun, stdin io.Reader, stderr io.Writer) int {
	done := make(chan int, 1)
	go func() { done <- stageBody(s, r, stdin, stderr) }()
	t := time.NewTimer(s.deadline + poststopGrace)
	defer t.Stop()
	select {
	case code := <-done:
		return code
	case <-t.C:
		fmt.Fprintf(stderr, "kc-hook: poststop not done after %v (--deadline and %v); kc-janitor reconcile will retry\n", s.deadline, poststopGrace)
		return exitFailed
	}
}

// preStart runs a pre-start stage, which must never stop a container from
// starting: the runtime fails the start when a hook exits non-zero or
// outlives its descriptor's timeout. Whatever holds the stage (a State
// never written, a ledger lock, an old wrapper slow to die) or crashes
// it, the hook says so and exits 0 within --deadline, below that
// timeout; main's exit ends what is still running.
func preStart(s *settings, r stageRun, stdin io.Reader, stderr io.Writer) int {
	r.until = time.Now().Add(s.deadline)
	done := make(chan int, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				preStartGaveUp(s, r.stage, stderr, fmt.Errorf("crashed: %v", p))
				done <- exitOK
			}
		}()
		done <- stageBody(s, r, stdin, stderr)
	}()
	t := time.NewTimer(s.deadline)
	defer t.Stop()
	select {
	case code := <-done:
		return code
	case <-t.C:
		preStartGaveUp(s, r.stage, stderr, fmt.Errorf("not done after %v (--deadline)", s.deadline))
		return exitOK
	}
}

// preStartGaveUp says why a pre-start stage gave up, on stderr and in the
// trace (runc throws away the stderr of a hook that exits 0).
func preStartGaveUp(s *settings, stage hook.Stage, stderr io.Writer, why error) {
	fmt.Fprintf(stderr, "kc-hook: %s %v; the container starts anyway\n", stage, why)
	hostUID := userns.HostEUID()
	e := ledger.TraceEntry{Time: time.Now().UTC(), Stage: string(stage), HostUID: hostUID, StateDir: s.stateDir, Error: why.Error()}
	_, _ = ledger.WriteTrace(traceFiles(hostUID), e) //nolint:errcheck // stderr already says it
}

// stageBody reads the State and runs the stage.
func stageBody(s *settings, r stageRun, stdin io.Reader, stderr io.Writer) int {
	stage := r.stage
	st, err := hook.ReadState(stdin)
	if err != nil {
		if stage == hook.StagePoststop {
			fmt.Fprintln(stderr, "kc-hook:", err)
			return exitBadInput
		}
		// A hook must never stop a container from starting, and the
		// runtime fails the start on any non-zero exit: a container ID
		// that is not 64 hex (ctr and nerdctl allow such IDs), garbage or
		// nothing on stdin are logged and the start goes on.
		fmt.Fprintf(stderr, "kc-hook: %v; nothing recorded, the container starts anyway\n", err)
		hostUID := userns.HostEUID()
		e := ledger.TraceEntry{Time: time.Now().UTC(), Stage: string(stage), HostUID: hostUID, StateDir: s.stateDir, Error: err.Error()}
		_, _ = ledger.WriteTrace(traceFiles(hostUID), e) //nolint:errcheck // stderr already says it
		return exitOK
	}

	// Only now, with usable input, may anything be written.
	cfg := hook.Config{
		StateDir:        s.stateDir,
		Comms:           r.comms,
		KillGrace:       s.killGrace,
		Deadline:        s.deadline,
		SupervisorsFile: s.supervisorsFile,
		Lister:          r.lister,
		Until:           r.until,
		Contain:         contain.Options{Systemd: systemd.Scoper},
	}
	hostUID := userns.HostEUID()
	logger, closeLog, logErr := openLog(cfg.StateDir, s.logFile, s.level, stderr)
	defer closeLog()
	cfg.Logger = logger.With("container", st.ID, "stage", string(stage), "host_uid", hostUID)
	// trace leaves a line where the user will look when the hook cannot
	// keep its books: runc throws away the stderr of a hook that exits 0.
	trace := func(err error) {
		e := ledger.TraceEntry{Time: time.Now().UTC(), Container: st.ID, Stage: string(stage), HostUID: hostUID, StateDir: cfg.StateDir, Error: err.Error()}
		if p, terr := ledger.WriteTrace(traceFiles(hostUID), e); terr != nil {
			cfg.Logger.Error("could not leave a trace", "err", terr)
		} else {
			cfg.Logger.Warn("left a trace", "file", p)
		}
	}
	if logErr != nil {
		trace(logErr)
	}

	if stage != hook.StagePoststop {
		if err := hook.Record(cfg, stage, st); err != nil {
			// A hook must never stop a container from starting.
			cfg.Logger.Error("bookkeeping failed; the container starts anyway", "err", err)
			if logErr == nil {
				trace(err)
			}
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
	if res.Unrecorded != nil && logErr == nil {
		trace(res.Unrecorded)
	}
	switch {
	case res.Failed:
		fmt.Fprintf(stderr, "kc-hook: a supervisor tree of container %.12s would not die; kc-janitor reconcile will retry\n", st.ID)
		return exitFailed
	case len(res.Refused) > 0:
		for _, t := range res.Refused {
			fmt.Fprintf(stderr, "kc-hook: supervisor tree pgid %d of container %.12s left alive: %s (kc-janitor reconcile reports it)\n", t.PGID, st.ID, t.Action)
		}
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

// checkSettingsFlag, first on the command line, makes kc-hook only judge
// the options, variables and stage after it, as the stage would, and say
// so on stdout: "kc-hook: settings ok" (exit 0) or "kc-hook: settings
// refused: WHY" (exit 2). It reads nothing and writes no file. kc-janitor
// doctor runs each descriptor's kc-hook so, with the descriptor's args
// and env: a pre-start stage only warns of settings it cannot use, and
// runc throws that warning away.
const checkSettingsFlag = "--check-settings"

func checkSettings(args []string, stdout io.Writer) int {
	refuse := func(err error) int {
		fmt.Fprintf(stdout, "%s: settings refused: %s\n", hookName, oneLine(err))
		return exitBadInput
	}
	cl, err := parseCommandLine(args)
	switch {
	case err != nil:
		return refuse(err)
	case cl.help || cl.version:
		return refuse(errors.New("the arguments ask for --help or --version: the hook would print and do nothing"))
	case cl.supervise():
		return refuse(errors.New("supervise is not a hook stage"))
	}
	if _, err := checkStage(&cl.settings, cl.args); err != nil {
		return refuse(err)
	}
	fmt.Fprintf(stdout, "%s: settings ok\n", hookName)
	return exitOK
}

// settingsError reports options or KC_* variables kc-hook cannot use. In
// a pre-start stage that is a warning, not a failure: the descriptor's env
// applies to every container, and the runtime fails a start on any
// non-zero exit, so one typo would stop every container on the host. The
// stage is still found among args when they did not parse; it must be a
// known one, so a misspelt stage stays a usage error.
func settingsError(stderr io.Writer, args []string, stateDir string, err error) int {
	stage, ok := preStartStage(args)
	if !ok {
		return usageError(stderr, hookName, err)
	}
	msg := oneLine(err)
	fmt.Fprintf(stderr, "%s: %s (see %s --help); nothing recorded, the container starts anyway\n", hookName, msg, hookName)
	hostUID := userns.HostEUID()
	e := ledger.TraceEntry{Time: time.Now().UTC(), Stage: string(stage), HostUID: hostUID, StateDir: stateDir, Error: "settings: " + msg}
	_, _ = ledger.WriteTrace(traceFiles(hostUID), e) //nolint:errcheck // stderr already says it
	return exitOK
}

// preStartStage finds a pre-start stage among a hook's arguments, which
// may not have parsed; none when they name supervise or poststop too.
func preStartStage(args []string) (hook.Stage, bool) {
	var found hook.Stage
	for _, a := range args {
		if a == superviseName {
			return "", false
		}
		switch st, err := hook.ParseStage(a); {
		case err != nil:
		case st == hook.StagePoststop:
			return "", false
		case found == "":
			found = st
		}
	}
	return found, found != ""
}

// traceFiles is where a hook that cannot keep its books says so; tests
// point it elsewhere.
var traceFiles = ledger.TraceFiles

// openLog opens the JSON-lines log, creating the state dir if needed (a
// --log-file's directory must exist: a typo in a descriptor must not have
// root make directories). When it cannot, logs go to stderr (which the
// runtime may throw away) and the error says why.
func openLog(stateDir, path string, level slog.Level, stderr io.Writer) (*slog.Logger, func(), error) {
	var err error
	if path == "" {
		path = filepath.Join(stateDir, "kc-hook.log")
		// Made as the ledger makes it: nothing through a directory or
		// symlink another user could change.
		if err = ledger.MakeStateDir(stateDir); err == nil {
			// Root appends and renames there: not in a state dir the
			// ledger refuses (others could write or swap it).
			err = ledger.CheckDir(stateDir)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	if err == nil {
		var f *os.File
		if f, err = openRotated(path, maxLogSize); err == nil {
			return slog.New(logkeys.Unique(slog.NewJSONHandler(f, opts))), func() { f.Close() }, nil
		}
	}
	return slog.New(logkeys.Unique(slog.NewJSONHandler(stderr, opts))), func() {}, fmt.Errorf("cannot open the hook log: %w", err)
}

// maxLogSize is where the hook log is rotated: every container's start
// and stop add a few lines, for the life of the host, and nothing else
// trims the file.
const maxLogSize = 1 << 20

// openRotated opens path for appending, first renaming it to path.1
// (replacing the previous one) once it has reached max bytes: the log
// takes at most about twice max. Hooks of many containers run at once;
// the one holding the file's lock renames, and only the file it locked,
// so two never rotate the same log twice. One that finds the lock taken
// appends where it is: the holder is renaming.
func openRotated(path string, max int64) (*os.File, error) {
	open := func() (f *os.File, null bool, err error) {
		// Root appends here: never through a symlink planted at the name,
		// and never waiting on a FIFO there (a regular file does not block).
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0o600)
		if err != nil {
			return nil, false, err
		}
		// A FIFO someone reads would take lines until its buffer is full
		// and then hold every write; another user's file is not ours.
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, false, err
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(1, 3):
			return f, true, nil // /dev/null, an operator's way to turn the log off
		case st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid():
			f.Close()
			return nil, false, fmt.Errorf("%s: not a regular file of uid %d", path, os.Geteuid())
		case st.Nlink != 1:
			// A hard link to a file of ours elsewhere (a root-owned one,
			// linked where a user can reach it) would get our lines.
			f.Close()
			return nil, false, fmt.Errorf("%s: the file has %d names (hard links)", path, st.Nlink)
		}
		return f, false, nil
	}
	f, null, err := open()
	if err != nil || null {
		return f, err
	}
	st, err := f.Stat()
	if err != nil || st.Size() < max {
		return f, nil
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return f, nil
	}
	// Still the file at path (not one another hook rotated away while
	// this one opened it)? A path that is a symlink is not: the link
	// would be renamed, not the log.
	if cur, err := os.Lstat(path); err == nil && os.SameFile(cur, st) {
		if err := rotate(path, path+".1"); err != nil {
			// No rotation (a directory, a symlink or another user's
			// file at path.1): start over rather than grow without
			// bound. The file is proven ours, one name, and the lock is
			// held.
			f.Truncate(0) //nolint:errcheck // a log that could not be cut is still a log
			return f, nil
		}
	}
	f.Close() // drops the lock
	f, _, err = open()
	return f, err
}

// rotate renames the log to old, which it replaces only when that is
// the previous log: a regular file of ours with one name. A rename
// never follows a symlink at old but destroys whatever is there, in a
// directory others may write (a --log-file in /tmp) another user's
// file. Where nothing is there, the rename must not replace what
// appears meanwhile.
func rotate(path, old string) error {
	var st unix.Stat_t
	err := unix.Lstat(old, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, old, unix.RENAME_NOREPLACE)
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Nlink != 1:
		return fmt.Errorf("%s is not a previous log of ours", old)
	}
	return os.Rename(path, old)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
