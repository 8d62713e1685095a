package e2e

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// TestWatchPidfdDeaths: with podman's events turned off (--no-events) and
// one round an hour, the tree of a container killed with `podman kill` is
// reaped from its init's pidfd alone; a running container's tree is not
// touched.
func TestWatchPidfdDeaths(t *testing.T) {
	pm := podmantest.New(t)
	url := pm.StartAPI(t)
	const comm = "kcsrv-e2e-pfd"
	live, victim := pm.Run(t), pm.Run(t)
	_, liveTree := startTree(t, t.TempDir(), live, testutil.Fake{Comm: comm})
	_, victimTree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
	w := startWatch(t, append(podmanWatchArgs(pm, url), "--no-events", "--supervisor-comm", comm, "--min-age", "0s",
		"--reconcile-apply", "--container", live, "--container", victim)...)
	w.waitLine(t, map[string]any{"msg": "live containers pinned", "pinned": float64(2), "events_only": float64(0)})
	if len(aliveOf(victimTree)) != len(victimTree) || len(aliveOf(liveTree)) != len(liveTree) {
		t.Fatal("the first round touched a running container's tree")
	}

	if _, err := pm.Podman("kill", victim); err != nil {
		t.Fatal(err)
	}
	waitAllDead(t, victimTree, 20*time.Second)
	l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
	t.Logf("death: %v", l)
	if l["reaped"] != float64(1) || l["via"] != "pidfd" || l["engine"] != "podman" {
		t.Errorf("death line %v, want one tree reaped, seen through the pidfd, podman's", l)
	}
	if len(aliveOf(liveTree)) != len(liveTree) {
		t.Fatal("the live container's tree lost a member when the other died")
	}
	if n := len(w.lines(map[string]any{"msg": "reconcile", "step": "reconcile"})); n != 1 {
		t.Errorf("%d rounds ran, want only the first: the reap was not the pidfd's", n)
	}
	if n := len(w.lines(map[string]any{"msg": "following container deaths"})); n != 0 {
		t.Errorf("watch followed engine events under --no-events (%d lines)", n)
	}
}

// TestWatchPidfdBurst: containers killed together (one `podman kill` of
// all of them, a drain) are reaped from their pidfds in a few passes, not
// one scan per death.
func TestWatchPidfdBurst(t *testing.T) {
	const n = 10
	pm := podmantest.New(t)
	url := pm.StartAPI(t)
	const comm = "kcsrv-e2e-pfb"
	args := append(podmanWatchArgs(pm, url), "--no-events", "--supervisor-comm", comm, "--min-age", "0s", "--reconcile-apply")
	kill := []string{"kill"}
	var trees [][]fingerprint.Stat
	for range n {
		id := pm.Run(t)
		_, tree := startTree(t, t.TempDir(), id, testutil.Fake{Comm: comm})
		trees = append(trees, tree)
		args = append(args, "--container", id)
		kill = append(kill, id)
	}
	w := startWatch(t, args...)
	w.waitLine(t, map[string]any{"msg": "live containers pinned", "pinned": float64(n)})
	start := time.Now()
	if _, err := pm.Podman(kill...); err != nil {
		t.Fatal(err)
	}
	for _, tree := range trees {
		waitAllDead(t, tree, 20*time.Second)
	}
	t.Logf("%d containers killed: all trees gone %v after the kill command started", n, time.Since(start).Round(time.Millisecond))
	for _, id := range kill[1:] {
		if l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": id}); l["reaped"] != float64(1) || l["via"] != "pidfd" {
			t.Errorf("death line %v, want one tree reaped, seen through the pidfd", l)
		}
	}
	// Each attempt at deaths is one scan; podman kills one container
	// after the other, so a few bursts, and a retry where its list still
	// said running.
	if scans := len(w.lines(map[string]any{"msg": "scanned", "step": "event"})); scans > n/2 {
		t.Errorf("%d scans for %d deaths, want a handful", scans, n)
	} else {
		t.Logf("%d scans for %d deaths", scans, n)
	}
}

// TestWatchDockerPidfdDeaths: Docker's list gives no init PID; watch asks
// inspect's State.Pid and pins it, so with Docker's events turned off
// (--no-events) and one round an hour, the tree of a container killed
// with `docker kill` is reaped from its init's pidfd; a running
// container's tree is not touched.
func TestWatchDockerPidfdDeaths(t *testing.T) {
	dt := dockertest.Need(t)
	const comm = "kcsrv-e2e-dpf"
	live, victim := dt.Run(t, nil), dt.Run(t, nil)
	_, liveTree := startTree(t, t.TempDir(), live, testutil.Fake{Comm: comm})
	_, victimTree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
	w := startWatch(t, "--engine", "docker", "--docker-url", dt.URL, "--no-events", "--supervisor-comm", comm,
		"--min-age", "0s", "--reconcile-apply", "--container", live, "--container", victim)
	w.waitLine(t, map[string]any{"msg": "live containers pinned", "pinned": float64(2), "events_only": float64(0)})
	if len(aliveOf(victimTree)) != len(victimTree) || len(aliveOf(liveTree)) != len(liveTree) {
		t.Fatal("the first round touched a running container's tree")
	}

	dt.Must(t, "kill", victim)
	waitAllDead(t, victimTree, 20*time.Second)
	l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
	t.Logf("death: %v", l)
	if l["reaped"] != float64(1) || l["via"] != "pidfd" || l["engine"] != "docker" {
		t.Errorf("death line %v, want one tree reaped, seen through the pidfd, Docker's", l)
	}
	if len(aliveOf(liveTree)) != len(liveTree) {
		t.Fatal("the live container's tree lost a member when the other died")
	}
	if n := len(w.lines(map[string]any{"msg": "reconcile", "step": "reconcile"})); n != 1 {
		t.Errorf("%d rounds ran, want only the first: the reap was not the pidfd's", n)
	}
}

// TestWatchContainerByNameFollowsOneContainer: `watch --container NAME`
// follows the container the name meant when it started, its sockets as
// its trees: once that container is removed and another is created under
// the same name, the sweep does not move into the new one (its trees are
// not the watch's to judge either), and says it cannot look.
func TestWatchContainerByNameFollowsOneContainer(t *testing.T) {
	pm := podmantest.New(t)
	url := pm.StartAPI(t)
	name := "kcw-" + testutil.RandomHex(t, 8)
	first := pm.Run(t, "--name", name)
	firstPID := pm.InitPID(t, first)
	w := startWatch(t, append(podmanWatchArgs(pm, url), "--interval", "1s", "--container", name)...)
	w.waitLine(t, map[string]any{"msg": "sweep", "container_pid": float64(firstPID)})
	if _, err := pm.Podman("rm", "-f", "-t", "0", first); err != nil {
		t.Fatal(err)
	}
	second := pm.Run(t, "--name", name)
	secondPID := pm.InitPID(t, second)
	w.waitLine(t, map[string]any{"msg": "cannot look into the container; sweep and cull skipped"})
	if ls := w.lines(map[string]any{"msg": "sweep", "container_pid": float64(secondPID)}); len(ls) > 0 {
		t.Errorf("the sweep moved into the new container of the same name: %v", ls[0])
	}
}
