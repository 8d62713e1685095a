package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// operatorEnv is a private podman API service and two stray trees of
// containers no engine knows, under a supervisor name of the test's own.
type operatorEnv struct {
	e        *podmantest.Env
	env      []string
	base     []string
	ids      [3]string
	pgids    [3]int
	stateDir string
}

func newOperatorEnv(t *testing.T, comm string) *operatorEnv {
	t.Helper()
	o := &operatorEnv{e: podmantest.New(t)}
	url := o.e.StartAPI(t)
	o.stateDir = filepath.Join(t.TempDir(), "state")
	o.env = append(o.e.Environ(), "KC_STATE_DIR="+o.stateDir)
	o.base = []string{"--podman-url", url, "--supervisor-comm", comm, "--min-age", "0s", "--kill-grace", "500ms"}
	for i := range o.ids {
		o.ids[i] = testutil.RandomHex(t, 64)
		_, ms := startTree(t, t.TempDir(), o.ids[i], testutil.Fake{Comm: comm})
		o.pgids[i] = ms[0].PGID
	}
	return o
}

func (o *operatorEnv) reconcile(t *testing.T, env []string, args ...string) (reconcileReport, string, int) {
	t.Helper()
	out, errOut, code := janitor(t, append(append([]string{}, o.env...), env...), append(append([]string{"reconcile", "--format", "json"}, o.base...), args...)...)
	var rep reconcileReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil && code != 1 {
		t.Fatalf("reconcile printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	return rep, errOut, code
}

// TestKCContainerScopesReconcile: KC_CONTAINER is --container for
// reconcile as for sweep and cull (DESIGN "The outside"): with two stray trees on the
// host, only the named container's is judged, and only it is reaped.
// KC_RECONCILE_CONTAINERS, the more specific variable, wins when both are
// set.
func TestKCContainerScopesReconcile(t *testing.T) {
	o := newOperatorEnv(t, "kcsrv-e2e-kcc")
	containers := func(rep reconcileReport) []string {
		var out []string
		for _, tr := range rep.Trees {
			out = append(out, tr.ContainerID)
		}
		return out
	}

	rep, errOut, code := o.reconcile(t, []string{"KC_CONTAINER=" + o.ids[0]})
	if code != 0 || len(rep.Trees) != 1 || rep.Trees[0].ContainerID != o.ids[0] || rep.Trees[0].Action != "would-reap" {
		t.Fatalf("KC_CONTAINER=%s: exit %d, trees %v (%+v), stderr %s", o.ids[0][:12], code, containers(rep), rep.Trees, errOut)
	}

	rep, _, code = o.reconcile(t, []string{"KC_CONTAINER=" + o.ids[0], "KC_RECONCILE_CONTAINERS=" + o.ids[1]})
	if code != 0 || len(rep.Trees) != 1 || rep.Trees[0].ContainerID != o.ids[1] {
		t.Fatalf("KC_RECONCILE_CONTAINERS must win: exit %d, trees %v", code, containers(rep))
	}

	rep, errOut, code = o.reconcile(t, []string{"KC_CONTAINER=" + o.ids[0]}, "--apply")
	if code != 0 || rep.action(o.pgids[0]) != "reaped" {
		t.Fatalf("KC_CONTAINER --apply: exit %d, %+v, stderr %s", code, rep.Trees, errOut)
	}
	if len(group(t, o.pgids[1])) == 0 {
		t.Fatalf("the other container's tree (group %d) was killed", o.pgids[1])
	}
	if len(group(t, o.pgids[0])) != 0 {
		t.Errorf("the named container's tree (group %d) is still alive", o.pgids[0])
	}

	// watch too: its reconcile judges only the named container, and its
	// sweep looks into that container, which is not running: that step
	// fails, never falling back to the host's sockets.
	env := append(append([]string{}, o.env...), "KC_CONTAINER="+o.ids[1], "KC_RECONCILE_APPLY=1")
	_, errOut, code = janitor(t, env, append([]string{"watch", "--once", "--no-events"}, o.base...)...)
	if code != 1 || !strings.Contains(errOut, "cannot look into the container") {
		t.Errorf("KC_CONTAINER watch --once: exit %d, want 1 (the sweep cannot look into a stopped container); stderr %s", code, errOut)
	}
	if len(group(t, o.pgids[1])) != 0 {
		t.Errorf("watch did not reap the named container's tree (group %d)", o.pgids[1])
	}
	if len(group(t, o.pgids[2])) == 0 {
		t.Errorf("watch reaped another container's tree (group %d)", o.pgids[2])
	}
}

// TestConcurrentApplyRunsReapOnce: two --apply runs at once serialise on
// the state dir's lock (DESIGN "One view of the host"): the tree is reaped, and reported
// reaped, exactly once.
func TestConcurrentApplyRunsReapOnce(t *testing.T) {
	o := newOperatorEnv(t, "kcsrv-e2e-twice")
	var wg sync.WaitGroup
	reps := make([]reconcileReport, 2)
	codes := make([]int, 2)
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[i], _, codes[i] = o.reconcile(t, nil, "--apply", "--container", o.ids[0])
		}()
	}
	wg.Wait()
	reaped := 0
	for i, rep := range reps {
		if codes[i] != 0 {
			t.Errorf("run %d: exit %d", i, codes[i])
		}
		if a := rep.action(o.pgids[0]); a == "reaped" || a == "gone" {
			reaped++
		}
	}
	if reaped != 1 {
		t.Errorf("the tree was reported reaped by %d runs, want 1: %+v / %+v", reaped, reps[0].Trees, reps[1].Trees)
	}
	if len(group(t, o.pgids[0])) != 0 {
		t.Errorf("tree %d still alive", o.pgids[0])
	}
	// The lock is only taken by runs that act.
	if _, err := os.Stat(filepath.Join(o.stateDir, "apply.lock")); err != nil {
		t.Errorf("no apply lock in the state dir: %v", err)
	}
}

// TestApplyThatCannotRecordDoesNotReap: a state dir that cannot be
// written means no reap could be recorded: the run logs an ERROR, exits
// 1 and signals nothing (no lock, no apply).
func TestApplyThatCannotRecordDoesNotReap(t *testing.T) {
	o := newOperatorEnv(t, "kcsrv-e2e-ro")
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := o.reconcile(t, nil, "--apply", "--container", o.ids[0], "--state-dir", filepath.Join(file, "state"))
	if code != 1 || !strings.Contains(errOut, "level=ERROR") || !strings.Contains(errOut, "nothing reaped") {
		t.Errorf("exit %d, want 1 with an ERROR saying nothing was reaped; stderr %s", code, errOut)
	}
	if n := len(group(t, o.pgids[0])); n == 0 {
		t.Error("the tree was reaped although nothing could be recorded")
	}
}

// TestFailedRunsLeaveAnAuditLine: each way a sweep or cull run can fail
// before it has anything to report leaves one line in the seed scripts'
// log file: the error, the container asked for, the exit code.
func TestFailedRunsLeaveAnAuditLine(t *testing.T) {
	e := podmantest.New(t)
	url := e.StartAPI(t)
	stopped := e.Run(t)
	stopContainer(t, e, stopped)
	env := append(e.Environ(), "KC_STATE_DIR="+t.TempDir())

	tests := []struct {
		name      string
		logEnv    string
		args      []string
		container string
		code      int
	}{
		{"no such container", "KC_SWEEPER_LOG", []string{"sweep", "--podman-url", url, "--container", "no-such-container-" + testutil.RandomHex(t, 8)}, "no-such-container-", 2},
		{"stopped container", "KC_CULLER_LOG", []string{"cull", "--podman-url", url, "--container", stopped}, stopped, 1},
		{"engine down", "KC_SWEEPER_LOG", []string{"sweep", "--engine", "podman", "--podman-url", "unix:///nonexistent/podman.sock", "--container", stopped}, stopped, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logf := filepath.Join(t.TempDir(), "audit.log")
			runEnv := append(append([]string{}, env...), tt.logEnv+"="+logf)
			if tt.code == 3 {
				runEnv = append(runEnv, "PATH="+t.TempDir()) // no podman CLI to fall back to
			}
			_, errOut, code := janitor(t, runEnv, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errOut)
			}
			data, err := os.ReadFile(logf)
			if err != nil {
				t.Fatalf("no audit log: %v", err)
			}
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			last := lines[len(lines)-1]
			for _, want := range []string{"level=ERROR", `msg="run failed"`, "exit=" + string(rune('0'+tt.code)), "container=" + tt.container, "err="} {
				if !strings.Contains(last, want) {
					t.Errorf("audit line lacks %q: %s", want, last)
				}
			}
		})
	}
}
