package e2e

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// BenchmarkWatchDeathToReap measures, with `kc-janitor watch --interval 1h
// --reconcile-apply` running, the time from the command that kills a
// container (`docker kill`; `podman kill`, no kc-hook installed;
// containerd: `ctr tasks rm -f`, which kills and deletes the task as a
// kubelet's stop does) to the last process of its
// host-side tree gone, polled every millisecond. Every death is reaped
// from its event alone. Reported over the iterations (run with
// -benchtime=20x or more, see docs/PERFORMANCE.md): p50/p95 of that time,
// of the kill command alone (its process start and API call), of watch's
// own latency_ms (from the death's time as the engine
// stamps it to the death handled), the share of deaths that needed more
// than one attempt, and the tree's own exit time (SIGTERM to its group
// gone, with no janitor) for comparison. podman runs three ways: as watch
// runs by default, from its inits' pidfds alone (--no-events; latency_ms
// is then from the pidfd becoming readable) and from its died events
// alone (--no-pidfd); %pidfd is the share of deaths seen through a pidfd.
func BenchmarkWatchDeathToReap(b *testing.B) {
	b.Run("docker", func(b *testing.B) {
		dt := dockertest.Need(b)
		deathToReap(b, "docker", []string{"--engine", "docker", "--docker-url", dt.URL},
			func(b *testing.B) string { return dt.Run(b, nil) },
			func(b *testing.B, id string) { dt.Must(b, "kill", id) })
	})
	b.Run("containerd", func(b *testing.B) {
		addr := containerdtest.Address(b)
		const ns = "kc-bench-w"
		deathToReap(b, "containerd", []string{"--engine", "containerd", "--containerd-address", addr, "--containerd-namespace", ns},
			func(b *testing.B) string {
				id := hexID(b)
				containerdtest.Run(b, addr, ns, id, nil, "/bin/sleep", "600")
				return id
			},
			func(b *testing.B, id string) { containerdtest.Ctr(b, addr, ns, "tasks", "rm", "-f", id) })
	})
	// podman: pidfd and events as watch runs by default; pidfd: the
	// init's pidfd alone (--no-events); events: podman's died events
	// alone (--no-pidfd).
	for name, extra := range map[string][]string{"podman": nil, "podman-pidfd": {"--no-events"}, "podman-events": {"--no-pidfd"}} {
		b.Run(name, func(b *testing.B) {
			// The API alone, as a host names its service: --podman-arg's
			// store check (GET /info, some 270 ms) is not on that path.
			pm := podmantest.New(b)
			deathToReap(b, "podman", append([]string{"--engine", "podman", "--podman-url", pm.StartAPI(b)}, extra...),
				func(b *testing.B) string { return pm.Run(b) },
				func(b *testing.B, id string) {
					if _, err := pm.Podman("kill", id); err != nil {
						b.Fatal(err)
					}
				})
		})
	}
	b.Run("tree-exit", func(b *testing.B) {
		var lat []time.Duration
		for range b.N {
			tree := startQuickTree(b, hexID(b), "kcsrv-bench-x")
			start := time.Now()
			if err := syscall.Kill(-tree[0].PGID, syscall.SIGTERM); err != nil {
				b.Fatal(err)
			}
			waitGone(b, tree)
			lat = append(lat, time.Since(start))
		}
		report(b, lat, "exit")
	})
}

// deathToReap runs b.N containers, each with a host-side tree, one watch
// scoped to them all, and kills them one by one.
func deathToReap(b *testing.B, engine string, engineArgs []string, run func(*testing.B) string, kill func(*testing.B, string)) {
	comm := "kcsrv-bench-" + engine[:1]
	ids := make([]string, b.N)
	trees := make([][]fingerprint.Stat, b.N)
	args := append([]string{"--supervisor-comm", comm, "--min-age", "0s", "--reconcile-apply"}, engineArgs...)
	for i := range b.N {
		ids[i] = run(b)
		trees[i] = startQuickTree(b, ids[i], comm)
		args = append(args, "--container", ids[i])
	}
	w := startWatch(b, args...)
	if slices.Contains(args, "--no-events") {
		w.waitLine(b, map[string]any{"msg": "live containers pinned", "pinned": float64(b.N)})
	} else {
		w.waitReady(b, engine)
	}
	var reap, handled, cmd []time.Duration
	retried, viaPidfd := 0, 0
	b.ResetTimer()
	for i, id := range ids {
		start := time.Now()
		kill(b, id)
		cmd = append(cmd, time.Since(start))
		waitGone(b, trees[i])
		reap = append(reap, time.Since(start))
		b.StopTimer()
		l := w.waitLine(b, map[string]any{"msg": "container death handled", "container": id})
		if l["reaped"] != float64(1) {
			b.Fatalf("death of %s: %v, want one tree reaped", id[:12], l)
		}
		handled = append(handled, time.Duration(l["latency_ms"].(float64))*time.Millisecond)
		if l["attempts"] != float64(1) {
			retried++
		}
		if l["via"] == "pidfd" {
			viaPidfd++
		}
		b.StartTimer()
	}
	b.StopTimer()
	report(b, reap, "kill-to-gone")
	report(b, cmd, "kill-cmd")
	report(b, handled, "watch-latency")
	b.ReportMetric(100*float64(retried)/float64(b.N), "%retried")
	b.ReportMetric(100*float64(viaPidfd)/float64(b.N), "%pidfd")
}

// startQuickTree is startTree without the child that ignores SIGTERM
// (whose kill grace would be all that is measured): the wrapper carrying
// id, the fake supervisor and two sleeping kernels.
func startQuickTree(b *testing.B, id, comm string) []fingerprint.Stat {
	b.Helper()
	k := testutil.StartKCServer(b, b.TempDir(), testutil.Fake{ContainerID: id, Children: 2, Comm: comm})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms := group(b, k.PGID)
		if len(ms) >= 4 {
			b.Cleanup(func() { killGroup(ms) })
			return ms
		}
		if time.Now().After(deadline) {
			b.Fatalf("tree of %d has %d members, want 4", k.PGID, len(ms))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitGone polls every millisecond until no member of tree is alive.
func waitGone(b *testing.B, tree []fingerprint.Stat) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(aliveOf(tree)) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("tree %d still alive after 30s", tree[0].PGID)
		}
		time.Sleep(time.Millisecond)
	}
}

func report(b *testing.B, lat []time.Duration, what string) {
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		b.ReportMetric(float64(lat[n/2].Microseconds())/1000, what+"-p50-ms")
		b.ReportMetric(float64(lat[min(n-1, n*95/100)].Microseconds())/1000, what+"-p95-ms")
		b.Logf("%s over %d: %v", what, n, fmt.Sprint(lat))
	}
}
