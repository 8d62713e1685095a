package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
)

const (
	flagHooksDir = "hooks-dir"
	flagIdle     = "idle"
)

func doctorCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.BoolFlag{Name: "fix", Usage: "reap the orphaned supervisor trees found, as reconcile --apply would", EnvVars: []string{"KC_DOCTOR_FIX"}},
		&cli.StringSliceFlag{Name: flagHooksDir, Usage: "oci-hooks(5) descriptor `DIR` podman reads (repeatable, in increasing precedence); default: " +
			doctor.DefaultHooksDir + ", " + doctor.OverrideHooksDir + " and containers.conf's hooks_dir", EnvVars: []string{"KC_HOOKS_DIR"}},
		&cli.StringFlag{Name: flagIdle, Value: "24h", Usage: "a session idle and disconnected longer than `DURATION` (or seconds) counts as abandoned", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
	}
	flags = append(flags, reconcileFlags()...)
	flags = append(flags, probeFlags()...)
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the host: hook installed and firing, container engines reachable, ledger usable, nothing left to clean up",
		Description: `Runs every check and prints one line per check:

   label .... ok|WARN|ERROR (detail)

with details indented below (or one JSON object with --format json);
with -q, only when a check is not ok.

Checks, in order: hook installed (a valid kc-hook descriptor for
poststop and for createRuntime in podman's hooks dirs, its binary
present and executable, since podman silently drops a descriptor whose
binary is missing, and the settings in its args and env accepted: doctor
runs kc-hook with --check-settings, as the descriptor would, unless it
is not named kc-hook, or it, its descriptor or a directory above either
could be changed by a user other than root or doctor's own (an ERROR:
the runtime runs it as root); and which containerd runtime handlers
carry it); hook alive (its log or ledger shows runs since boot); engines
(which ones --engine auto found, and where it looked for the others);
one check per engine, podman, docker, containerd, cri (reachable,
version, containers, live, and the UID its answer vouches for, read from
the answering connection; a named engine that cannot be asked is an
ERROR); state dir and ledger; process listing (the BPF iterator or
/proc, and why); deaths seen from the kernel (how many live containers
watch would pin through a pidfd); supervisor containment; orphaned
supervisor trees (a dry-run reconcile; --fix reaps them as reconcile
--apply would); orphan sockets (a dry-run sweep); abandoned sessions (a
cull audit).

Without --fix nothing is changed (the state dir check writes and removes
one probe file there), and --fix only reaps stray trees.`,
		Flags:  flags,
		Action: runDoctor,
	}
}

// probeFlags are sweep's socket flags without --container, which
// reconcileFlags defines with another meaning.
func probeFlags() []cli.Flag {
	var out []cli.Flag
	for _, f := range socketFlags() {
		switch f.Names()[0] {
		case flagContainer, flagContainerPID:
			continue
		}
		out = append(out, f)
	}
	return out
}

// confHooksDirs returns containers.conf's hooks_dir (podman's own
// defaults included), or nil when the configuration cannot be read.
func confHooksDirs(log *slog.Logger) []string {
	dirs, err := doctor.ConfHooksDirs(doctor.SystemConfPaths(), os.Getenv)
	if err != nil {
		log.Warn("cannot read containers.conf; looking in the default hooks dirs only", "err", err)
		return nil
	}
	return dirs
}

func runDoctor(c *cli.Context) error {
	se, err := preamble(c, "doctor", plan{scan: true, probe: true, idle: true, check: func(globals) error {
		for _, d := range c.StringSlice(flagHooksDir) {
			if !filepath.IsAbs(d) {
				return usageErr("--hooks-dir must be an absolute path, not %q", d)
			}
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer se.close()
	hooksDirs := doctor.HooksDirs(c.StringSlice(flagHooksDir), confHooksDirsUnless(c, se.log))
	rep := janitor.Doctor(c.Context, se.s, c.Bool("fix"), hooksDirs, se.log, metricsOf(c))

	switch {
	case se.g.JSON:
		err = rep.WriteJSON(c.App.Writer)
	case se.g.Quiet() && rep.Worst == doctor.OK:
		// For cron, which mails whatever reaches stdout.
	default:
		err = rep.WriteText(c.App.Writer)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitFailed)
	}
	if rep.Worst != doctor.OK {
		return cli.Exit("", int(rep.Worst))
	}
	return nil
}

// confHooksDirsUnless reads containers.conf only when --hooks-dir is not
// given (it replaces every other directory).
func confHooksDirsUnless(c *cli.Context, log *slog.Logger) []string {
	if len(c.StringSlice(flagHooksDir)) > 0 {
		return nil
	}
	return confHooksDirs(log)
}
