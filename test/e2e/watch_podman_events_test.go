package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// podmanWatchArgs point watch at pm's API service and store.
func podmanWatchArgs(pm *podmantest.Env, url string) []string {
	args := []string{"--engine", "podman", "--podman-url", url}
	for _, a := range pm.GlobalArgs() {
		args = append(args, "--podman-arg="+a)
	}
	return args
}

// TestWatchPodmanDeathEvents: on a podman host with no kc-hook installed
// (the private podman's hooks dir is empty), watch with --interval 1h
// reaps the tree of a container killed with `podman kill`, and of one
// removed with `podman rm -f`, from their "died" events alone; a running
// container's tree is not touched; each death's question names its
// container (and a canary) alone. Without an API service the deaths come
// from `podman events` when the CLI reads the same store (--podman-arg),
// else there are none, and watch says so.
func TestWatchPodmanDeathEvents(t *testing.T) {
	pm := podmantest.New(t)
	url := pm.StartAPI(t)
	const comm = "kcsrv-e2e-wpm"
	base := append(podmanWatchArgs(pm, url), "--supervisor-comm", comm, "--min-age", "0s")

	t.Run("killed and removed containers reaped and the live one untouched", func(t *testing.T) {
		live, killed, removed := pm.Run(t), pm.Run(t), pm.Run(t)
		_, liveTree := startTree(t, t.TempDir(), live, testutil.Fake{Comm: comm})
		_, killedTree := startTree(t, t.TempDir(), killed, testutil.Fake{Comm: comm})
		_, removedTree := startTree(t, t.TempDir(), removed, testutil.Fake{Comm: comm})
		mf := filepath.Join(t.TempDir(), "kc.prom")
		w := startWatch(t, append(base, "--reconcile-apply", "--metrics-file", mf,
			"--container", live, "--container", killed, "--container", removed)...)
		w.waitReady(t, "podman")
		for name, ms := range map[string][]fingerprint.Stat{"live": liveTree, "killed": killedTree, "removed": removedTree} {
			if len(aliveOf(ms)) != len(ms) {
				t.Fatalf("the first round touched the %s container's tree while it ran", name)
			}
		}

		for i, c := range []struct {
			id   string
			tree []fingerprint.Stat
			cmd  []string
		}{{killed, killedTree, []string{"kill", killed}}, {removed, removedTree, []string{"rm", "-f", "-t", "0", removed}}} {
			if _, err := pm.Podman(c.cmd...); err != nil {
				t.Fatal(err)
			}
			waitAllDead(t, c.tree, 20*time.Second)
			l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": c.id})
			t.Logf("podman %s: %v", c.cmd[0], l)
			if l["reaped"] != float64(1) || l["engine"] != "podman" {
				t.Errorf("podman %s: death line %v, want one tree reaped, reported by podman", c.cmd[0], l)
			}
			if v := deathsHandled(t, mf, "podman"); v != float64(i+1) {
				t.Errorf("deaths handled by podman = %v after %d", v, i+1)
			}
			// The first round's answer listed all three: the death's
			// questions name the dead container and a canary alone.
			asked := w.lines(map[string]any{"msg": "podman API answered", "container": c.id})
			if len(asked) == 0 {
				t.Errorf("podman %s: no question of the death's logged", c.cmd[0])
			}
			for _, l := range asked {
				if n, _ := l["containers"].(float64); n < 1 || n > 2 {
					t.Errorf("podman %s: the death's question listed %v containers, want the dead one and a canary at most: %v", c.cmd[0], l["containers"], l)
				}
			}
		}
		if len(aliveOf(liveTree)) != len(liveTree) {
			t.Fatal("the live container's tree lost a member when others died")
		}
		if n := len(w.lines(map[string]any{"msg": "reconcile", "step": "reconcile"})); n != 1 {
			t.Errorf("%d rounds ran, want only the first: the reaps were not the events'", n)
		}
	})

	t.Run("no API service: podman events as a child", func(t *testing.T) {
		gone := "unix://" + filepath.Join(t.TempDir(), "podman.sock")
		victim := pm.Run(t)
		_, tree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
		w := startWatch(t, append(podmanWatchArgs(pm, gone), "--supervisor-comm", comm, "--min-age", "0s",
			"--reconcile-apply", "--container", victim)...)
		w.waitReady(t, "podman")
		if len(aliveOf(tree)) != len(tree) {
			t.Fatal("the first round touched a running container's tree")
		}
		if _, err := pm.Podman("kill", victim); err != nil {
			t.Fatal(err)
		}
		waitAllDead(t, tree, 20*time.Second)
		if l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim}); l["reaped"] != float64(1) {
			t.Errorf("death line %v, want one tree reaped", l)
		}
		if len(w.lines(map[string]any{"msg": "podman events (CLI) followed"})) != 1 {
			t.Error("the death did not come through podman events")
		}
	})

	t.Run("no API service and no CLI of the same store means no events", func(t *testing.T) {
		// Without --podman-arg the CLI could reach that podman only through
		// its (absent) service.
		gone := "unix://" + filepath.Join(t.TempDir(), "podman.sock")
		w := startWatch(t, "--engine", "podman", "--podman-url", gone, "--supervisor-comm", comm, "--container", pm.Run(t))
		// pidfds are on: the container's death is still seen, through its
		// pinned init, and the line says so.
		w.waitLine(t, map[string]any{"msg": "engine reports no container deaths; they are seen through pinned inits and the relists (every 5s)", "engine": "podman"})
		if n := len(w.lines(map[string]any{"msg": "following container deaths"})); n != 0 {
			t.Errorf("watch follows deaths without a service (%d lines)", n)
		}
	})
}
