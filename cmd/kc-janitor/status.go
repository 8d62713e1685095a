package main

import (
	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/janitor"
)

func statusCommand() *cli.Command {
	flags := append([]cli.Flag{}, reconcileFlags()...)
	flags = append(flags, probeFlags()...)
	return &cli.Command{
		Name:  "status",
		Usage: "show the ledger, the live supervisor trees with their containers, and the supervisor sockets",
		Description: `The operator's one-look view; changes nothing (not even the ledger).

LEDGER lists kc-hook's records: container, its engine, the hook stages
seen, the trees recorded, the outcome of the last poststop or reap. TREES
lists the supervisor trees running now with their container's engine
(podman, docker, containerd, cri) and its state there ("gone": no
engine lists it; "?": an engine could not be asked) and what reconcile
would decide for them. SOCKETS lists kc-*.sock files with their
classification, as a dry-run sweep sees them (with --container, only
those of --socket-dir). With -q it prints only
when it has PROBLEMS.`,
		Flags:  flags,
		Action: runStatus,
	}
}

func runStatus(c *cli.Context) error {
	se, err := preamble(c, "status", plan{scan: true, probe: true})
	if err != nil {
		return err
	}
	defer se.close()
	rep, err := janitor.Status(c.Context, se.s, se.log)
	if err != nil {
		return err // a usage error
	}
	out := &reportWriter{w: c.App.Writer}
	switch {
	case se.g.JSON:
		writeJSON(out, rep)
	case se.g.Quiet() && len(rep.Errors) == 0:
		// For cron: the look is printed only when it has PROBLEMS.
	default:
		rep.Text(out)
	}
	return out.done()
}
