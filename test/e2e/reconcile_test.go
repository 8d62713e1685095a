package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

type reconcileReport struct {
	LivenessKnown bool   `json:"liveness_known"`
	Source        string `json:"source"`
	DryRun        bool   `json:"dry_run"`
	Trees         []struct {
		ContainerID string `json:"container_id"`
		PGID        int    `json:"pgid"`
		Action      string `json:"action"`
		Error       *string
	} `json:"trees"`
}

func (r reconcileReport) action(pgid int) string {
	for _, t := range r.Trees {
		if t.PGID == pgid {
			return t.Action
		}
	}
	return ""
}

// decisions is the report reduced to what the API and CLI paths must agree
// on.
func (r reconcileReport) decisions() []string {
	var out []string
	for _, t := range r.Trees {
		out = append(out, t.ContainerID+" "+t.Action)
	}
	slices.Sort(out)
	return out
}

// TestReconcileRealPodman: containers stopped without the hook leave real
// trees behind; the janitor, asking a real podman API service, lists them,
// reaps them only with --apply, and never touches a running container's
// tree, a young tree, or anything when podman cannot be asked.
func TestReconcileRealPodman(t *testing.T) {
	e := podmantest.New(t)
	url := e.StartAPI(t)
	stopped := e.Run(t)
	running := e.Run(t)
	// A supervisor name of this test's own: --apply must not reap the fake
	// trees of tests running in parallel in other packages.
	const comm = "kcsrv-e2e-rec"
	_, strayTree := startTree(t, t.TempDir(), stopped, testutil.Fake{IgnoreTerm: true, Comm: comm})
	_, liveTree := startTree(t, t.TempDir(), running, testutil.Fake{Comm: comm})
	stopContainer(t, e, stopped) // no hook installed: the tree stays

	env := append(e.Environ(), "KC_STATE_DIR="+t.TempDir())
	base := []string{"--podman-url", url, "--format", "json", "--kill-grace", "500ms", "--supervisor-comm", comm,
		// Scoped to this test's containers: other packages' tests run fake
		// trees (and kc-hook wrappers, which always count) in parallel.
		"--container", stopped, "--container", running}
	for _, a := range e.GlobalArgs() {
		base = append(base, "--podman-arg="+a)
	}
	run := func(t *testing.T, env []string, args ...string) (reconcileReport, int) {
		t.Helper()
		out, errOut, code := janitor(t, env, append([]string{"reconcile"}, append(base, args...)...)...)
		var rep reconcileReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("reconcile printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
		}
		return rep, code
	}

	t.Run("young trees are skipped", func(t *testing.T) {
		rep, code := run(t, env, "--min-age", "1h")
		if code != 0 || rep.action(strayTree[0].PGID) != "skipped-young" {
			t.Fatalf("exit %d, report %+v", code, rep)
		}
	})

	var apiDecisions []string
	t.Run("dry run lists the stray and kills nothing", func(t *testing.T) {
		rep, code := run(t, env, "--min-age", "0s")
		if code != 0 || !rep.LivenessKnown || rep.Source != "api" || !rep.DryRun {
			t.Fatalf("exit %d, report %+v", code, rep)
		}
		if a := rep.action(strayTree[0].PGID); a != "would-reap" {
			t.Errorf("stray tree: %q, want would-reap", a)
		}
		if a := rep.action(liveTree[0].PGID); a != "skipped-live" {
			t.Errorf("running container's tree: %q, want skipped-live", a)
		}
		if n := len(aliveOf(strayTree)); n != len(strayTree) {
			t.Errorf("a dry run killed %d processes", len(strayTree)-n)
		}
		apiDecisions = rep.decisions()
	})

	t.Run("CLI fallback gives the same set", func(t *testing.T) {
		e.StopAPI(t)
		defer e.StartAPI(t)
		rep, code := run(t, env, "--min-age", "0s")
		if code != 0 || rep.Source != "cli" {
			t.Fatalf("exit %d, report %+v", code, rep)
		}
		if got := rep.decisions(); !slices.Equal(got, apiDecisions) {
			t.Errorf("CLI decisions %v differ from API decisions %v", got, apiDecisions)
		}
	})

	t.Run("podman unreachable: exit 3, nothing touched", func(t *testing.T) {
		noPodman := []string{"PATH=" + t.TempDir()}
		for _, kv := range env {
			if !strings.HasPrefix(kv, "PATH=") {
				noPodman = append(noPodman, kv)
			}
		}
		out, _, code := janitor(t, noPodman, "reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--supervisor-comm", comm,
			"--container", stopped, "--min-age", "0s", "--apply", "--format", "json")
		if code != 3 {
			t.Fatalf("exit %d, want 3; output %s", code, out)
		}
		var rep reconcileReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.LivenessKnown || len(rep.Trees) != 0 {
			t.Errorf("report %s (%v)", out, err)
		}
		if n := len(aliveOf(strayTree)); n != len(strayTree) {
			t.Errorf("with podman unreachable %d processes were killed", len(strayTree)-n)
		}
	})

	t.Run("apply reaps the stray and only it", func(t *testing.T) {
		rep, code := run(t, env, "--min-age", "0s", "--apply")
		if code != 0 || rep.DryRun {
			t.Fatalf("exit %d, report %+v", code, rep)
		}
		if a := rep.action(strayTree[0].PGID); a != "reaped" {
			t.Errorf("stray tree: %q, want reaped", a)
		}
		if n := len(aliveOf(strayTree)); n != 0 {
			t.Errorf("%d stray members survived --apply", n)
		}
		if n := len(aliveOf(liveTree)); n != len(liveTree) {
			t.Errorf("--apply killed %d members of a running container's tree", len(liveTree)-n)
		}
	})

	t.Run("text output", func(t *testing.T) {
		out, _, code := janitor(t, env, "reconcile", "--podman-url", url, "--min-age", "0s", "--supervisor-comm", comm, "--container", running)
		if code != 0 || !strings.Contains(out, "skipped-live") || !strings.Contains(out, running[:12]) {
			t.Errorf("exit %d, output:\n%s", code, out)
		}
	})
}
