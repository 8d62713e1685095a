package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

func hexID(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestReconcileContainerd: containerd is the ground truth. A running
// task's tree is skipped-live whatever namespace its container is in;
// once the task is killed and the container removed (ctr, no hook),
// reconcile --apply reaps the tree; an unreachable containerd makes the
// truth unknown (exit 3) and leaves a stray tree alive.
func TestReconcileContainerd(t *testing.T) {
	addr := containerdtest.Address(t)
	running, gone := hexID(t), hexID(t)
	containerdtest.Run(t, addr, "kc-e2e-a", running, nil, "/bin/sleep", "600")
	containerdtest.Run(t, addr, "kc-e2e-b", gone, nil, "/bin/sleep", "600")
	// A supervisor name of this test's own, and --container scoping: other
	// packages' fake trees are never this test's to reap.
	const comm = "kcsrv-e2e-ctrd"
	_, liveTree := startTree(t, t.TempDir(), running, testutil.Fake{Comm: comm})
	_, strayTree := startTree(t, t.TempDir(), gone, testutil.Fake{Comm: comm})

	base := []string{"--engine", "containerd", "--containerd-address", addr, "--format", "json",
		"--state-dir", t.TempDir(), "--kill-grace", "500ms", "--supervisor-comm", comm, "--min-age", "0s",
		"--container", running, "--container", gone}
	run := func(t *testing.T, extra ...string) (reconcileReport, string, int) {
		t.Helper()
		args := append([]string{"reconcile"}, base...)
		out, errOut, code := janitor(t, nil, append(args, extra...)...)
		var rep reconcileReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("reconcile printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
		}
		return rep, errOut, code
	}

	t.Run("running task in any namespace is live", func(t *testing.T) {
		rep, errOut, code := run(t, "--apply")
		if code != 0 || !rep.LivenessKnown {
			t.Fatalf("exit %d, liveness known %v: %s", code, rep.LivenessKnown, errOut)
		}
		for _, tr := range []struct {
			pgid int
			want string
		}{{liveTree[0].PGID, "skipped-live"}, {strayTree[0].PGID, "skipped-live"}} {
			if got := rep.action(tr.pgid); got != tr.want {
				t.Errorf("tree %d: %q, want %q", tr.pgid, got, tr.want)
			}
		}
		if len(aliveOf(liveTree)) != len(liveTree) || len(aliveOf(strayTree)) != len(strayTree) {
			t.Fatal("a live container's tree lost a member")
		}
	})

	containerdtest.Kill(t, addr, "kc-e2e-b", gone)
	containerdtest.Ctr(t, addr, "kc-e2e-b", "tasks", "rm", gone)
	containerdtest.Ctr(t, addr, "kc-e2e-b", "containers", "rm", gone)

	t.Run("unreachable containerd touches nothing", func(t *testing.T) {
		out, errOut, code := janitor(t, nil, "reconcile", "--engine", "containerd", "--containerd-address", filepath.Join(t.TempDir(), "absent.sock"),
			"--state-dir", t.TempDir(), "--min-age", "0s", "--supervisor-comm", comm, "--apply", "--container", gone)
		if code != 3 {
			t.Fatalf("exit %d, want 3\nstdout: %s\nstderr: %s", code, out, errOut)
		}
		if !strings.Contains(errOut, "absent.sock") {
			t.Errorf("stderr does not name the socket: %s", errOut)
		}
		if len(aliveOf(strayTree)) != len(strayTree) {
			t.Fatal("the stray tree was touched while containerd could not be asked")
		}
	})

	t.Run("a namespace that does not exist touches nothing", func(t *testing.T) {
		_, errOut, code := janitor(t, nil, append(append([]string{"reconcile"}, base...), "--apply", "--containerd-namespace", "kc-no-such-ns")...)
		if code != 3 || !strings.Contains(errOut, "kc-no-such-ns") {
			t.Fatalf("exit %d, want 3 naming the namespace: %s", code, errOut)
		}
		if len(aliveOf(strayTree)) != len(strayTree) {
			t.Fatal("the stray tree was touched")
		}
	})

	t.Run("dry run, then apply reaps the removed container's tree", func(t *testing.T) {
		rep, errOut, code := run(t)
		if code != 0 || rep.action(strayTree[0].PGID) != "would-reap" || rep.action(liveTree[0].PGID) != "skipped-live" {
			t.Fatalf("dry run: exit %d, stray %q, live %q: %s", code, rep.action(strayTree[0].PGID), rep.action(liveTree[0].PGID), errOut)
		}
		if len(aliveOf(strayTree)) != len(strayTree) {
			t.Fatal("a dry run touched the stray tree")
		}
		rep, errOut, code = run(t, "--apply")
		if code != 0 || rep.action(strayTree[0].PGID) != "reaped" {
			t.Fatalf("apply: exit %d, stray %q: %s", code, rep.action(strayTree[0].PGID), errOut)
		}
		waitAllDead(t, strayTree, 10*time.Second)
		if len(aliveOf(liveTree)) != len(liveTree) {
			t.Fatal("the running container's tree lost a member")
		}
	})
}
