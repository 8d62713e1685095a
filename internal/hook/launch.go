package hook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// executable returns the kc-hook binary the wrapper runs (the running
// one); tests point it at a built kc-hook.
var executable = os.Executable

// wrapperPath is the environment the wrapper and its command start with,
// before the allowlist entry's env.
const wrapperPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// errAlreadyRunning aborts the ledger write when a wrapper for the same
// init is already running.
var errAlreadyRunning = errors.New("a supervisor for this init is already running")

// SupervisorLog is where a container's wrapper (and its command) write;
// see ledger.SupervisorLog.
func SupervisorLog(stateDir, containerID string) string {
	return ledger.SupervisorLog(stateDir, containerID)
}

// launchSupervisor starts `kc-hook supervise` for a container annotated
// io.kc-watchman.supervisor=NAME, with NAME's command from the allowlist,
// and records it in the ledger. It returns at once: the wrapper is a
// session leader the hook does not wait for. Everything that goes wrong is
// logged and nothing fails the hook: the container starts anyway.
//
// One wrapper per container: a wrapper still alive for the same init
// process means there is nothing to do; one alive for an earlier init (a
// `podman restart` whose poststop did not reap it) is taken down first.
func launchSupervisor(cfg Config, stage Stage, st *specs.State, init *ledger.Process) {
	name, ok := st.Annotations[supervise.Annotation]
	if !ok || (stage != StageCreateRuntime && stage != StagePoststart) {
		return
	}
	log := logger(cfg).With("supervisor", name)
	if init == nil {
		log.Error("supervisor not launched: the runtime gave no init pid")
		return
	}
	file := cfg.SupervisorsFile
	if file == "" {
		file = supervise.DefaultAllowlistFile
	}
	al, err := supervise.LoadAllowlist(file)
	if err != nil {
		log.Error("supervisor refused: allowlist unusable; the container starts anyway", "file", file, "err", err)
		return
	}
	cmd, err := al.Resolve(name, supervise.Vars{ContainerID: st.ID, InitPID: init.PID})
	if err != nil {
		log.Error("supervisor refused: not in the allowlist; the container starts anyway", "file", file, "err", err)
		return
	}
	exe, err := executable()
	if err != nil {
		log.Error("supervisor not launched: cannot find the kc-hook binary", "err", err)
		return
	}
	initStat := fingerprint.Stat{PID: init.PID, StartTicks: init.StartTicks}
	store, err := ledger.Open(cfg.StateDir)
	if err != nil {
		log.Error("supervisor not launched: no ledger", "err", err)
		return
	}

	// An earlier wrapper for an earlier init is stopped outside the
	// ledger lock (it records its own outcome under that lock).
	if rec, err := store.Load(st.ID); err == nil && store.Current(rec) {
		if old, spec, ok := liveWrapper(root(cfg), rec.Supervisor, st.ID); ok && !fingerprint.Same(spec.Init, initStat) {
			log.Info("stopping the supervisor of the previous init", "pid", old.PID, "old_init_pid", spec.Init.PID)
			if err := stopWrapper(cfg, old); err != nil {
				log.Error("supervisor not launched: the previous one would not die", "pid", old.PID, "err", err)
				return
			}
		}
	}

	argv := supervise.Argv(exe, supervise.WrapperFlags{
		StateDir:     cfg.StateDir,
		KillGrace:    cfg.KillGrace,
		MaxRestarts:  cmd.MaxRestarts,
		RestartDelay: cmd.RestartDelay,
		PdeathSig:    supervise.SignalName(cmd.PdeathSig),
	}, supervise.Spec{ContainerID: st.ID, Init: initStat, Command: cmd.Argv})
	env := append([]string{wrapperPath}, cmd.Env...)
	logPath := SupervisorLog(cfg.StateDir, st.ID)

	if left := timeLeft(cfg); left < LaunchMargin {
		log.Error("supervisor not launched: the stage's deadline is too near", "left", left)
		return
	}
	var started *ledger.Process
	err = store.Update(st.ID, func(r *ledger.Record) error {
		if left := timeLeft(cfg); left < LaunchMargin/2 {
			return fmt.Errorf("the stage's deadline is too near (%v left)", left.Round(time.Millisecond))
		}
		if old, spec, ok := liveWrapper(root(cfg), r.Supervisor, st.ID); ok {
			if fingerprint.Same(spec.Init, initStat) {
				return errAlreadyRunning
			}
			return fmt.Errorf("the supervisor of a previous init (pid %d) is still running", old.PID)
		}
		p, err := startWrapper(root(cfg), exe, argv, env, logPath)
		if err != nil {
			return err
		}
		started = p
		r.Supervisor = p
		return nil
	})
	switch {
	case errors.Is(err, errAlreadyRunning):
		log.Info("supervisor already running for this init")
	case started == nil:
		log.Error("supervisor not launched", "err", err)
	case err != nil:
		log.Error("supervisor launched but not recorded", "pid", started.PID, "err", err)
	default:
		log.Info("supervisor launched", "pid", started.PID, "argv0", cmd.Argv[0], "log", logPath)
	}
}

// liveWrapper returns the recorded wrapper p if it is still that process,
// alive, and a `kc-hook supervise` for container cid.
func liveWrapper(root string, p *ledger.Process, cid string) (fingerprint.Stat, supervise.Spec, bool) {
	if p == nil {
		return fingerprint.Stat{}, supervise.Spec{}, false
	}
	st, err := fingerprint.Revalidate(root, fingerprint.Stat{PID: p.PID, StartTicks: p.StartTicks})
	if err != nil || st.Zombie() {
		return st, supervise.Spec{}, false
	}
	argv, err := fingerprint.ReadArgv(root, p.PID)
	if err != nil {
		return st, supervise.Spec{}, false
	}
	spec, err := supervise.ParseArgv(argv)
	if err != nil || spec.ContainerID != cid {
		return st, supervise.Spec{}, false
	}
	return st, spec, true
}

// stopWrapper stops an earlier wrapper of the container. SIGTERM to the
// wrapper alone, through a pidfd, makes it take its own group down by its
// own rules (its command's UID as well as its own: an allowlist entry may
// start the command through setpriv; members of other UIDs and other
// containers spared), and it is waited for. One that has not exited
// within half the time left gets pgkill's group kill as the wrapper's
// UID, which signals nothing in a group of mixed UIDs.
func stopWrapper(cfg Config, w fingerprint.Stat) error {
	deadline := cfg.Deadline
	if deadline <= 0 {
		deadline = 20 * time.Second
	}
	// Time is left to launch the new one, and to record it.
	deadline = min(deadline, timeLeft(cfg)-LaunchMargin)
	if deadline <= 0 {
		return errors.New("no time left before the stage's deadline")
	}
	end := time.Now().Add(deadline)
	if st, err := fingerprint.ReadStat(root(cfg), w.PID); err != nil || st.StartTicks != w.StartTicks || st.PGID != w.PGID {
		return nil // gone, its PID another's, or not the group it led
	}
	if gone, _ := pgkill.Terminate(root(cfg), w, deadline/2); gone {
		return nil
	}
	return killWrapperGroup(cfg, w, time.Until(end))
}

// killWrapperGroup takes a wrapper's group down with pgkill (SIGTERM,
// SIGKILL after the grace) within d, as the wrapper's UID.
func killWrapperGroup(cfg Config, w fingerprint.Stat, d time.Duration) error {
	if d <= 0 {
		return errors.New("the earlier wrapper did not stop in time")
	}
	members := pgkill.Members(root(cfg), w.PGID)
	// Read before the revalidation below, which proves them the wrapper's.
	ids, err := fingerprint.ReadUIDs(root(cfg), w.PID)
	if err != nil {
		return nil
	}
	// The listing names the wrapper's group only if the wrapper still held
	// it afterwards: a group number cannot be reused while a member (even
	// a zombie) holds it, and a dead wrapper cannot come back. Otherwise
	// the number may already be another group's, and its members innocents.
	if st, err := fingerprint.Revalidate(root(cfg), w); err != nil || st.PGID != w.PGID || st.Zombie() {
		return nil
	}
	found := false
	for _, m := range members {
		found = found || fingerprint.Same(m, w)
	}
	if !found {
		members = append(members, w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	opt := pgkill.Options{Root: root(cfg), Grace: cfg.KillGrace, UID: fingerprint.SoleUID(ids), CheckUID: true}
	r := pgkill.Kill(ctx, pgkill.Group{PGID: w.PGID, Members: members}, opt)
	if r.Outcome == action.WouldNotDie || r.Outcome == action.SkipOtherUID {
		return fmt.Errorf("the earlier wrapper did not stop, and its group is not one UID's: %w", r.Err)
	}
	return nil
}

// startWrapper starts the wrapper as a session leader with stdin on
// /dev/null, stdout and stderr on its log file and / as its working
// directory, and returns its identity without waiting for it.
func startWrapper(root, exe string, argv, env []string, logPath string) (*ledger.Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return nil, fmt.Errorf("creating the supervisor log directory: %w", err)
	}
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the supervisor log: %w", err)
	}
	defer f.Close()
	// Descriptors the runtime leaked into the hook (pipes a runtime or
	// conmon waits on to see EOF) must not live on in the wrapper.
	cloexecInherited()
	c := &exec.Cmd{
		Path:        exe,
		Args:        argv,
		Env:         env,
		Dir:         "/",
		Stdout:      f,
		Stderr:      f,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("starting the wrapper: %w", err)
	}
	pid := c.Process.Pid
	st, err := fingerprint.ReadStat(root, pid)
	c.Process.Release() //nolint:errcheck // never waited for: it outlives the hook
	if err != nil {
		return nil, fmt.Errorf("wrapper %d vanished at once: %w", pid, err)
	}
	return &ledger.Process{PID: pid, StartTicks: st.StartTicks, Comm: st.Comm}, nil
}

// cloexecInherited sets close-on-exec on every descriptor above stderr.
func cloexecInherited() {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC) //nolint:errcheck // the ReadDir's own fd is gone by now
		}
	}
}

func logger(cfg Config) *slog.Logger {
	if cfg.Logger != nil {
		return cfg.Logger
	}
	return slog.New(slog.NewJSONHandler(io.Discard, nil))
}

// LaunchMargin is the least time before cfg.Until a launch starts with:
// the ledger lock's wait (ledger.LockTimeout), the wrapper's start and
// its record. doctor refuses a descriptor whose deadline is no longer.
const LaunchMargin = ledger.LockTimeout + 2*time.Second

// timeLeft is the time until cfg.Until; without one, all the time.
func timeLeft(cfg Config) time.Duration {
	if cfg.Until.IsZero() {
		return math.MaxInt64
	}
	return time.Until(cfg.Until)
}
