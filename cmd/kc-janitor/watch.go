package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

func watchCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.DurationFlag{Name: "interval", Value: 15 * time.Minute, Usage: "time between the starts of two rounds", EnvVars: []string{"KC_WATCH_INTERVAL"}},
		&cli.BoolFlag{Name: "reconcile-apply", Usage: "reap stray trees", DefaultText: "dry run", EnvVars: []string{"KC_RECONCILE_APPLY", "KC_APPLY"}},
		&cli.BoolFlag{Name: "sweep-apply", Usage: "unlink stale sockets", DefaultText: "dry run", EnvVars: []string{"KC_SWEEP", "KC_APPLY"}},
		&cli.BoolFlag{Name: "no-reconcile", Usage: "skip reconcile (where no engine kc-janitor can ask is the ground truth)", EnvVars: []string{"KC_WATCH_NO_RECONCILE"}},
		&cli.BoolFlag{Name: "no-cull", Usage: "skip the session audit", EnvVars: []string{"KC_WATCH_NO_CULL"}},
		&cli.BoolFlag{Name: "once", Usage: "run one round and exit with its worst exit code (for a systemd timer or cron)", EnvVars: []string{"KC_WATCH_ONCE"}},
		&cli.BoolFlag{Name: "no-events", Usage: "do not follow the engines' container deaths (Docker's die, podman's died, containerd's task exit): a dead container's trees then wait for the next round", EnvVars: []string{"KC_WATCH_NO_EVENTS"}},
		&cli.BoolFlag{Name: "no-pidfd", Usage: "do not hold a pidfd for each live container's init: its death then waits for the engine's event (podman's file events: up to 250ms) or the next round", EnvVars: []string{"KC_WATCH_NO_PIDFD"}},
		&cli.StringFlag{Name: "metrics-listen", Usage: "serve /metrics, /healthz and /readyz over HTTP on `ADDR` (host:port; off by default)", EnvVars: []string{"KC_METRICS_LISTEN"}},
		&cli.StringFlag{Name: "health-listen", Usage: "serve /healthz and /readyz alone on `ADDR`, a listener metrics clients cannot fill (e.g. 127.0.0.1:9476 for the kubelet; off by default)", EnvVars: []string{"KC_HEALTH_LISTEN"}},
		&cli.StringFlag{Name: flagIdle, Value: "24h", Usage: "cull: report sessions idle longer than `DURATION` (or seconds)", EnvVars: []string{"KC_IDLE", "KC_IDLE_SECONDS"}},
	}
	flags = append(flags, reconcileFlags()...)
	flags = append(flags, probeFlags()...)
	return &cli.Command{
		Name:  "watch",
		Usage: "run reconcile, sweep and cull every --interval (for a systemd service or a DaemonSet)",
		Description: `Each round runs reconcile, then sweep, then cull (--no-reconcile and
--no-cull leave a step out), with the same meaning
and flags as the single commands; reconcile and sweep are dry runs unless
--reconcile-apply / --sweep-apply (KC_APPLY=1 turns both on; cull never
kills). Every round logs one summary line per step; --metrics-file is
rewritten after every round.

--metrics-listen ADDR serves the running watch's own metrics over HTTP:
/metrics (counters since the start: rounds, trees reaped, sockets
unlinked, deaths handled and engine errors per engine; the last round;
kc_janitor_ground_truth_known{engine}; the histogram
kc_janitor_death_to_reap_seconds), /healthz (503 once no round has
finished for twice --interval plus the longest a round may take within
its bounds: sweep deadlines, lookups, engine timeouts, the apply lock,
the kill grace) and /readyz (200
while serving: an engine that is down shows in the metrics, not as an
unready pod). --health-listen ADDR serves the two probes alone, on a
listener of their own (8 clients) that /metrics clients, who may hold
all 64 of theirs, cannot fill: bound to loopback, for a kubelet's
probes. An address that cannot be bound is a usage error (exit 2).
--once serves nothing.

Between rounds, watch follows the container deaths Docker (/events,
"die"), podman (its API service's libpod events, "died") and containerd
(/tasks/exit, /tasks/delete) report and reconciles the dead container's
trees at once, with the round's decision table: the engines are asked
again, --min-age and --container hold, and without --reconcile-apply the
stray is only logged as would-reap. A dropped event stream is subscribed
again with backoff (250ms up to 30s), then one reconcile catches up on
the deaths it missed. Without a podman API service, podman's deaths come
from "podman events" run as a child when the CLI reads the same store
(the default socket, or --podman-arg naming it); else there are none,
and the pinned inits with their relists (below), kc-hook's poststop or
the next round do this job.
--no-events (or --no-reconcile) turns this off; --once never follows.

watch also holds a pidfd for each live container's init (the PID
podman's list, Docker's inspect, containerd's task or the CRI gives) and
decides that container's trees the moment its init exits, the same way,
whatever the engine's events do; deaths within 5ms of each other are
decided on one scan. An init whose start time, cgroup or PID namespace
is not the container's is not pinned, and its container is followed by
events and by the relist every 5s (gone from its engine's list: dead).
--no-pidfd turns this off.

A round that fails (an engine unreachable, an unreadable directory, a tree
that would not die, even a crash inside a step) is logged and the next
round runs on time. SIGTERM or SIGINT stop the loop after the current
round (a second signal abandons it); the exit status is then 128 plus the
first signal's number (130 for SIGINT, 143 for SIGTERM), which the
shipped units count as a clean stop (SuccessExitStatus=130 143).

With --container (KC_CONTAINER), every step stays inside the containers
named: reconcile and the deaths judge only their trees, and sweep and cull
look into their socket directories (found again every round, as a
restarted container has a new init; a container that is not running is
left out and fails the round, the others are still swept) instead of the
host's. A name means the container it
names when watch starts: one created later under that name is another.

Examples:
   kc-janitor watch --interval 15m
   KC_APPLY=1 kc-janitor watch --interval 5m \
      --metrics-file /var/lib/prometheus/node-exporter/kc-janitor.prom
   kc-janitor watch --once                    # one round, for a timer`,
		Flags:  flags,
		Action: runWatch,
	}
}

func runWatch(c *cli.Context) error {
	se, err := preamble(c, "watch", plan{scan: true, probe: true, idle: true, noReport: true, check: func(g globals) error {
		// watch prints no report: what it finds is in its log lines. A
		// KC_FORMAT=json meant for the other commands, in
		// /etc/default/kc-janitor, must not stop the service.
		if g.JSON && (os.Getenv("KC_FORMAT") != "json" || cliapp.Typed(c.App, commandLine(c), flagFormat)) {
			return usageErr("watch prints no report, only log lines: for JSON use --log-format json, not --format json")
		}
		if c.Duration("interval") <= 0 {
			return usageErr("--interval must be positive")
		}
		// Checked with --once too, where nothing is served: a malformed
		// address in /etc/default/kc-janitor must not wait for the
		// service's next start to be found.
		for _, name := range []string{"metrics-listen", "health-listen"} {
			if addr := c.String(name); addr != "" {
				if err := checkListenAddr(addr); err != nil {
					return usageErr("--%s %q: %v", name, addr, err)
				}
			}
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer se.close()
	log := se.log
	w := janitor.Watch{Settings: se.s, ReconcileOn: !c.Bool("no-reconcile"), CullOn: !c.Bool("no-cull"),
		Interval: c.Duration("interval"), MetricsFile: sharedString(c, flagMetricsFile)}
	w.Reconcile.Apply = c.Bool("reconcile-apply")
	w.Reconcile.Logger = log.With("step", "reconcile")
	w.Sockets.Apply = c.Bool("sweep-apply")
	w.Events = w.ReconcileOn && !c.Bool("no-events")
	w.Pidfd = w.ReconcileOn && !c.Bool("no-pidfd")
	if ids := slices.Sorted(maps.Keys(se.s.Reconcile.Containers)); len(ids) > 0 {
		// A watch scoped to containers never widens past them: sweep and
		// cull look into those containers, not the host's /tmp. They
		// follow the containers the names meant at start-up, as the
		// trees' decisions do: a container created later under the same
		// name is not the one the watch was started for.
		// A round's ctx: a second signal abandons a hung engine's lookup.
		// A container that cannot be looked into (stopped, its engine
		// not answering) is left out of the round's sweep, not the
		// others with it.
		w.SocketTargets = func(ctx context.Context) ([]sweep.Target, error) {
			var ts []sweep.Target
			var errs []error
			for _, ref := range ids {
				if err := ctx.Err(); err != nil {
					return ts, errors.Join(append(errs, err)...)
				}
				m, err := resolveContainer(ctx, c, se.g, ref, true)
				var t sweep.Target
				if err == nil {
					t, err = containerTarget(ref, m)
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				ts = append(ts, t)
			}
			return ts, errors.Join(errs...)
		}
	}

	if c.Bool("once") {
		// Nothing runs long enough to be scraped; the setting is shared
		// with kc-janitor-watch.service through /etc/default/kc-janitor,
		// and must not fail the timer's one round.
		if code := w.Once(c.Context, log); code != exitOK {
			return cli.Exit("", code)
		}
		return nil
	}

	stale := janitor.StaleAfter(w.Interval, w.Sockets.Deadline, w.Engine.AskTimeout(), w.Reconcile.KillGrace, len(w.Reconcile.Containers))
	for _, l := range []struct {
		flag   string
		listen func(string, *janitor.Live, time.Duration, *slog.Logger) (*janitor.MetricsServer, error)
	}{{"metrics-listen", janitor.Listen}, {"health-listen", janitor.ListenHealth}} {
		addr := c.String(l.flag)
		if addr == "" {
			continue
		}
		if w.Live == nil {
			w.Live = janitor.NewLive()
		}
		srv, err := l.listen(addr, w.Live, stale, log)
		if err != nil {
			return usageErr("--%s %s: %v", l.flag, addr, err)
		}
		defer func() {
			if err := srv.Close(); err != nil {
				log.Warn("serving "+l.flag, "err", err)
			}
		}()
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	stopping := make(chan struct{})
	roundCtx, cancelRound := context.WithCancel(c.Context)
	defer cancelRound()
	// The first signal decides the exit status (130 or 143, as a shell
	// reports a command it stopped): a stopped watch did not finish its job,
	// and the units list both as a successful stop.
	var stopSig atomic.Int32
	go func() {
		sig := <-sigs
		stopSig.Store(int32(sig.(syscall.Signal)))
		log.Info("stopping after the current round", "signal", sig.String())
		close(stopping)
		sig = <-sigs
		log.Warn("abandoning the current round", "signal", sig.String())
		cancelRound()
	}()
	if err := engineUsageErr(w.Run(roundCtx, stopping, log)); err != nil {
		return err
	}
	if sig := stopSig.Load(); sig != 0 {
		return cli.Exit("", stoppedBy(syscall.Signal(sig)))
	}
	return nil
}

// checkListenAddr refuses what net.Listen would: no port, a port out of
// range.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}
