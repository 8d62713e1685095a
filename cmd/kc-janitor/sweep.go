package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Flags shared by sweep and cull to say where supervisors' sockets are.
const (
	flagSocketDir    = "socket-dir"
	flagContainer    = "container"
	flagContainerPID = "container-pid"
	flagTimeout      = "timeout"
	flagWorkers      = "workers"
	flagDeadline     = "sweep-deadline"
	flagHashedMinAge = "hashed-min-age"
)

func socketFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: flagSocketDir, Usage: "socket `DIR` to look in (repeatable; the last component may be a glob); default: /tmp and /run/user/*", EnvVars: []string{"KC_SOCKET_DIR"}},
		&cli.StringFlag{Name: flagContainer, Usage: "look in the socket dirs inside container `NAME`, ID, unique ID prefix or namespace/pod/container, of any engine asked (through /proc/<init pid>/root, with the container's PID and network namespaces)", EnvVars: []string{"KC_CONTAINER"}},
		&cli.IntFlag{Name: flagContainerPID, Usage: "host `PID` of the container's init process (instead of asking the engines)", EnvVars: []string{"KC_CONTAINER_PID"}, Hidden: true},
		&cli.DurationFlag{Name: flagTimeout, Value: sweep.DefaultTimeout, Usage: "timeout of one request to a supervisor", EnvVars: []string{"KC_PROBE_TIMEOUT"}},
		&cli.IntFlag{Name: flagWorkers, Value: sweep.DefaultWorkers, Usage: "sockets probed concurrently", EnvVars: []string{"KC_PROBE_WORKERS"}},
		&cli.DurationFlag{Name: flagDeadline, Value: sweep.DefaultDeadline, Usage: "bound on all of a sweep's probing, and of cull's audit; sockets not probed by then are unknown and kept, supervisors not asked are reported not audited", EnvVars: []string{"KC_SWEEP_DEADLINE"}},
	}
}

func sweepCommand() *cli.Command {
	return &cli.Command{
		Name:  "sweep",
		Usage: "find orphan kc-*.sock supervisor sockets; unlink them with --apply",
		Description: `A socket kc-<pid>.sock (control) or kc-<pid>.<x>.sock (session) is stale
only when three gates agree: its owner <pid> is not a live supervisor (gone,
a thread ID, a zombie, another program, or started after the socket was
created); nothing listens on it and no socket, in any state, is bound to its
path (/proc/net/unix); and GET /status is silent twice (3 s connect, 5 s
per try, 2 s apart). Gates that disagree give "unknown": kept. Session
sockets follow their server's control socket. A socket reached under
several names (hard links) is probed once; probing ends at
--sweep-deadline, and sockets not probed by then are unknown. No /status
answer over 1 MiB is read.

Kallichore names a session socket kc-<hex>.sock (a u64 hash: 1-16 lowercase
hex digits, unpadded) when the usual path would be too long; a hash of
digits only that reads as a PID is taken as kc-<pid>.sock, and is unknown,
never stale, when /status answers with another process_id. That name
carries no PID, so the owner cannot be checked: such a socket is stale only
when nothing listens on it and no socket is bound to its path (one bound but
not listening refuses connections too), GET /status is silent twice, and its
ctime is at least --hashed-min-age old. Anything that listens, is bound to
its path or answers keeps it live. It is reported as kind "session" with
pid 0.

Without --socket-dir, the directories named by live supervisors (their
--socket-dir, --unix-socket, XDG_RUNTIME_DIR and TMPDIR) are swept too, but
only those reached without symlinks, through directories a UID that named
them may search, and owned by that UID or root's and writable by it (the
others are reported as not swept); at most 8 per user (under /tmp and
/run/user/* too) and 256 in all are learnt, on the host only of
supervisors in its PID namespace, and one warning line counts those
left out. An entry that cannot
be read (another user's FUSE mount) is kept as unknown.

Dry run unless --apply (KC_SWEEP=1 or KC_APPLY=1). Only sockets (never
symlinks, FIFOs or regular files) owned by the expected uid and still the
same inode as when classified are unlinked. KC_SWEEPER_LOG names a log file
when --log-file is not given.`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "apply", Usage: "unlink stale sockets", DefaultText: "dry run", EnvVars: []string{"KC_SWEEP", "KC_APPLY"}},
			&cli.DurationFlag{Name: flagHashedMinAge, Value: sweep.DefaultHashedMinAge, Usage: "least age (since its ctime) at which a hashed-name kc-<hex>.sock may be stale", EnvVars: []string{"KC_SWEEP_HASHED_MIN_AGE"}},
		}, socketFlags()...),
		Action: runSweep,
	}
}

func runSweep(c *cli.Context) error {
	se, err := preamble(c, "sweep", plan{target: true, logEnv: "KC_SWEEPER_LOG", check: func(globals) error {
		// Zero or less would let a socket that is bound but not yet
		// listening be unlinked under its server.
		if c.Duration(flagHashedMinAge) <= 0 {
			return usageErr("--%s must be positive", flagHashedMinAge)
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer se.close()
	g, log, cfg := se.g, se.log, se.s.Sockets
	cfg.Apply = c.Bool("apply")
	cfg.Logger = log
	cfg.HashedMinAge = c.Duration(flagHashedMinAge)

	rep, err := sweep.Sweep(c.Context, cfg)
	if err != nil {
		return cli.Exit(fmt.Sprintf("sweep: %v", err), exitFailed)
	}
	janitor.RecordSweep(metricsOf(c), rep)
	for _, e := range rep.DirErrors {
		log.Error("socket directory", "err", e)
	}
	rep.Log(cfg.Logger)
	switch {
	case g.JSON:
		err = rep.WriteJSON(c.App.Writer)
	case g.Quiet() && !rep.Failed() && len(rep.DirErrors) == 0:
		// A quiet run prints only failures: its findings are in the log
		// (for cron, which mails whatever reaches stdout).
	default:
		err = rep.WriteText(c.App.Writer)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	switch {
	case rep.Failed():
		return cli.Exit("", exitFailed)
	case len(rep.DirErrors) > 0:
		return cli.Exit("", exitFailed)
	}
	return nil
}
