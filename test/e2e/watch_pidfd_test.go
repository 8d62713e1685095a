package e2e

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/podmantest"
	"github.com/kc-watchman/kc-watchman/internal/testkit"
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
	_, liveTree := startTree(t, t.TempDir(), live, testkit.Fake{Comm: comm})
	_, victimTree := startTree(t, t.TempDir(), victim, testkit.Fake{Comm: comm})
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
