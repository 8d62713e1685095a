package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

func reconcileCommand() *cli.Command {
	return &cli.Command{
		Name:  "reconcile",
		Usage: "find supervisor trees whose container is gone (the container engines are the ground truth) and, with --apply, reap them",
		Description: `A tree is a stray when no engine asked (--engine: podman, docker,
containerd; auto asks every one found here) lists its container as live,
its age (the youngest of its leader and the members that name a
container, by argv or the ledger: a kernel's short-lived children do not
count) is known and at least --min-age, its group is not led by a foreign
process, its processes belong to a UID an engine's answer vouches for,
and no local evidence says the container still runs: a live process in
its own cgroup under a conmon or containerd-shim, or its recorded init
alive (a monitor alone is not evidence). Such a tree is
skipped-contradicted.

Without --apply nothing is signalled: the strays are listed as would-reap.
If an engine cannot be asked, or root's evidence contradicts the engines
for two or more containers none of them knows, nothing at all is done and
the exit code is 3. An --apply run that finds more strays than --max-reap
(or, without --container, more than half of the trees of the UIDs the
engines answer for) reaps none.

Examples:
   kc-janitor reconcile                      # dry run
   kc-janitor reconcile --format json
   kc-janitor reconcile --apply --kill-grace 10s`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "apply", Usage: "reap the strays", DefaultText: "dry run", EnvVars: []string{"KC_RECONCILE_APPLY", "KC_APPLY"}},
		}, reconcileFlags()...),
		Action: runReconcile,
	}
}

// reconcileFlags are shared by reconcile, doctor and watch.
func reconcileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "min-age", Value: 90 * time.Second, Usage: "leave trees younger than this alone", EnvVars: []string{"KC_MIN_AGE"}},
		&cli.DurationFlag{Name: "ledger-retention", Value: reconcile.DefaultLedgerRetention, Usage: "dry runs remove the ledger record of a container that is gone and whose processes are all dead once it is this old (only the file: nothing is signalled; --apply removes such records at once)", EnvVars: []string{"KC_LEDGER_RETENTION"}},
		&cli.DurationFlag{Name: "kill-grace", Value: pgkill.DefaultGrace, Usage: "wait between SIGTERM and SIGKILL", EnvVars: []string{"KC_KILL_GRACE"}},
		&cli.StringSliceFlag{Name: "container", Usage: "only consider trees of this container, repeatable: a full 64-hex `ID` (taken as is: its container may be gone), or a unique ID prefix, name or namespace/pod/container the engines resolve; KC_RECONCILE_CONTAINERS wins over KC_CONTAINER when both are set", EnvVars: []string{"KC_RECONCILE_CONTAINERS", "KC_CONTAINER"}},
		&cli.IntFlag{Name: "max-reap", Value: 50, Usage: "with --apply, reap nothing (exit 1) when more trees than `N` are stray, or, without --container, more than half of all trees of the UIDs the engines answer for (from 3 strays on): a wrong ground truth at scale looks exactly like that (watch: trees of containers whose init the kernel saw exit do not count)", EnvVars: []string{"KC_MAX_REAP"}},
		&cli.BoolFlag{Name: "full-scan", Usage: "read every process, also reporting foreign groups (slower)", EnvVars: []string{"KC_FULL_SCAN"}},
		&cli.StringFlag{Name: "bpf", Value: "auto", Usage: "list processes through a BPF task iterator, `MODE` auto (where the kernel allows it, else /proc), on (fail without it) or off (never load a BPF program); --full-scan reads /proc regardless", EnvVars: []string{"KC_BPF"}},
	}
}

func runReconcile(c *cli.Context) error {
	se, err := preamble(c, "reconcile", plan{scan: true})
	if err != nil {
		return err
	}
	defer se.close()
	g, log := se.g, se.log
	se.s.Reconcile.Apply = c.Bool("apply")

	out := &reportWriter{w: c.App.Writer}
	rep, liveErr, err := janitor.Reconcile(c.Context, se.s, log)
	if err == nil {
		janitor.RecordReconcile(metricsOf(c), "reconcile", rep.Report, liveErr == nil)
	}
	if liveErr != nil {
		if g.JSON {
			writeJSON(out, rep)
		} else {
			msg := liveErr.Error()
			if !errors.Is(liveErr, engine.ErrUnknown) {
				msg = "ground truth unknown: " + msg
			}
			fmt.Fprintf(out, "%s\nnothing was touched.\n", msg)
		}
		return cli.Exit("", exitUnknown)
	}
	if err != nil {
		log.Error("reconcile failed", "err", err)
		return cli.Exit(err.Error(), exitFailed)
	}
	janitor.LogReconcile(c.Context, log, rep.Report)
	switch {
	case g.JSON:
		writeJSON(out, rep)
	case g.Quiet() && !rep.Failed():
		// A quiet run prints only failures: its findings are in the log
		// (for cron, which mails whatever reaches stdout).
	default:
		rep.Text(out)
	}
	if rep.Failed() {
		return cli.Exit("", exitFailed)
	}
	return out.done()
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// reportWriter keeps the first failed write of a command's report: a
// report lost to a full disk or a closed pipe must not pass for a run
// that said what it did (exit 1).
type reportWriter struct {
	w   io.Writer
	err error
}

func (r *reportWriter) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.w.Write(p)
	r.err = err
	return n, err
}

// done is the command's result once its report is written.
func (r *reportWriter) done() error {
	if r.err != nil {
		return cli.Exit(fmt.Sprintf("writing the report: %v", r.err), exitFailed)
	}
	return nil
}
