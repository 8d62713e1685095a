package e2e

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// TestContainerdEvidenceOfRunning: evidence that a container runs is a
// live process in its cgroup, never its shim (DESIGN "Ground truth must be corroborated").
//
// A pod: a sandbox and an app container sharing one runc v2 shim (the
// io.kubernetes.cri.sandbox-id annotation groups them), whose argv names
// the sandbox alone. Asked about the wrong namespace, the app container's
// tree is contradicted, not would-reap; with the sandbox's tree too,
// two containers no engine knows run here as root: exit 3.
//
// A task killed and not deleted keeps its shim: its tree is would-reap,
// and --apply scoped by --container reaps it.
func TestContainerdEvidenceOfRunning(t *testing.T) {
	addr := containerdtest.Address(t)
	const ns = "kc-e2e-pod"
	sandbox, app, exited := hexID(t), hexID(t), hexID(t)
	group := []string{"--annotation", "io.kubernetes.cri.sandbox-id=" + sandbox}
	// runc leaves the namespace's cgroup (/<ns>) when the containers in
	// it are deleted; it is empty once they are (cleanups run last first).
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + ns)
		dirs2, _ := filepath.Glob("/sys/fs/cgroup/" + ns)
		for _, d := range append(dirs, dirs2...) {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Logf("removing the namespace's cgroup: %v", err)
			}
		}
	})
	containerdtest.Run(t, addr, ns, sandbox, group, "/bin/sleep", "600")
	appInit := containerdtest.Run(t, addr, ns, app, group, "/bin/sleep", "600")
	// The pod's one shim: the app's init is its child, and its argv names
	// the sandbox alone.
	st, err := fingerprint.ReadStat("/proc", appInit)
	if err != nil {
		t.Fatal(err)
	}
	shim, err := fingerprint.Read("/proc", st.PPID)
	if err != nil {
		t.Fatal(err)
	}
	if argv := strings.Join(shim.Argv, " "); !strings.Contains(argv, sandbox) || strings.Contains(argv, app) {
		t.Fatalf("the app's init %d is not under the sandbox's shim: parent %d %q", appInit, shim.PID, argv)
	}
	containerdtest.Run(t, addr, ns, exited, nil, "/bin/sleep", "600")

	// The wrong store: a namespace that exists and holds no pod.
	const wrong = "kc-e2e-no-pod"
	containerdtest.Ctr(t, addr, wrong, "namespaces", "create", wrong)
	t.Cleanup(func() { _, _ = containerdtest.TryCtr(addr, wrong, nil, "namespaces", "remove", wrong) })

	const comm = "kcsrv-e2e-evid"
	_, appTree := startTree(t, t.TempDir(), app, testutil.Fake{Comm: comm})
	_, sandboxTree := startTree(t, t.TempDir(), sandbox, testutil.Fake{Comm: comm})
	_, exitedTree := startTree(t, t.TempDir(), exited, testutil.Fake{Comm: comm})

	run := func(t *testing.T, args ...string) (reconcileReport, string, int) {
		t.Helper()
		base := []string{"reconcile", "--engine", "containerd", "--containerd-address", addr, "--format", "json",
			"--state-dir", t.TempDir(), "--kill-grace", "500ms", "--supervisor-comm", comm, "--min-age", "0s"}
		out, errOut, code := janitor(t, nil, append(base, args...)...)
		var rep reconcileReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("reconcile printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
		}
		return rep, errOut, code
	}

	t.Run("a pod's app container asked about the wrong namespace", func(t *testing.T) {
		rep, errOut, code := run(t, "--containerd-namespace", wrong, "--container", app)
		if got := rep.action(appTree[0].PGID); code != 0 || got != "skipped-contradicted" {
			t.Fatalf("exit %d, app tree %q, want skipped-contradicted: %s", code, got, errOut)
		}
		_, errOut, code = run(t, "--containerd-namespace", wrong, "--apply", "--container", app, "--container", sandbox)
		if code != 3 {
			t.Fatalf("exit %d, want 3 (two running containers no engine knows): %s", code, errOut)
		}
		if len(aliveOf(appTree)) != len(appTree) || len(aliveOf(sandboxTree)) != len(sandboxTree) {
			t.Fatal("a running pod's tree was touched")
		}
	})

	containerdtest.Kill(t, addr, ns, exited) // no delete: the shim stays

	t.Run("a task killed and not deleted", func(t *testing.T) {
		rep, errOut, code := run(t, "--containerd-namespace", ns, "--container", exited)
		if got := rep.action(exitedTree[0].PGID); code != 0 || got != "would-reap" {
			t.Fatalf("exit %d, tree %q, want would-reap: %s", code, got, errOut)
		}
		rep, errOut, code = run(t, "--containerd-namespace", ns, "--apply", "--container", exited)
		if got := rep.action(exitedTree[0].PGID); code != 0 || got != "reaped" {
			t.Fatalf("apply: exit %d, tree %q, want reaped: %s", code, got, errOut)
		}
		waitAllDead(t, exitedTree, 10*time.Second)
		if len(aliveOf(appTree)) != len(appTree) {
			t.Fatal("the running app container's tree lost a member")
		}
	})
}
