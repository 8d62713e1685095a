//go:build reliability

package reliability

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

const wrongComm = "kcrel-wrong"

// TestWrongStoreContradicted (DESIGN "Ground truth must be corroborated"): reconcile
// --apply asks a real podman API service that runs on an empty store of
// its own (--root/--runroot in the test's temp dirs) and answers [] while
// containers run in another real store. A tree whose container's conmon
// is alive, or whose ledger init (this boot, alive, no poststop) is, is
// skipped-contradicted; two such trees make the run unknown: exit 3,
// nothing touched. A tree with no evidence is reaped by the same runs, so
// the wrong service's [] really was believed where nothing contradicts it.
func TestWrongStoreContradicted(t *testing.T) {
	store := podmantest.New(t) // where the containers really run
	empty := podmantest.New(t) // the wrong store, asked through its API
	wrongURL := empty.StartAPI(t)
	if out, err := empty.Podman("ps", "-aq"); err != nil || out != "" {
		t.Fatalf("the wrong store is not empty: %q %v", out, err)
	}

	state := t.TempDir()
	noCLI := t.TempDir()
	env := baseEnv(noCLI, "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+wrongComm)

	// A tree (supervisor leading its group, a kernel) for container id.
	tree := func(id string) []fingerprint.Stat {
		sup := startSupervisor(t, wrongComm, id, &syscall.SysProcAttr{Setpgid: true})
		return []fingerprint.Stat{sup.Stat, startKernel(t, inGroup(sup.PID)).Stat}
	}
	// Evidence 1: a real container; its conmon carries -c <id>.
	withConmon := store.Run(t)
	if pid := store.Inspect(t, withConmon, "{{.State.ConmonPid}}"); pid == "" || pid == "0" {
		t.Fatalf("container %s has no conmon (%q)", withConmon, pid)
	}
	// Evidence 2: no container process at all, but the ledger's
	// createRuntime init of this boot, alive, with no poststop.
	withInit := newCID(t)
	init := startKernel(t, &syscall.SysProcAttr{Setpgid: true})
	if r := runTool(t, hookBin(t), env, `{"ociVersion":"1.0.2","id":"`+withInit+`","status":"creating","pid":`+strconv.Itoa(init.PID)+`}`, "createRuntime"); r.Code != 0 {
		t.Fatalf("createRuntime: exit %d: %s", r.Code, r.Stderr)
	}
	trees := map[string][]fingerprint.Stat{withConmon: tree(withConmon), withInit: tree(withInit)}

	reconcile := func(ids ...string) (reconcileJSON, toolRun) {
		args := []string{"reconcile", "--apply", "--format", "json", "--engine", "podman", "--podman-url", wrongURL,
			"--podman-timeout", "30s", "--min-age", "0s", "--kill-grace", "200ms"}
		for _, id := range ids {
			args = append(args, "--container", id)
		}
		r := runTool(t, janitorBin(t), env, "", args...)
		var rep reconcileJSON
		decodeJSON(t, r, &rep)
		return rep, r
	}
	intact := func(what string, ms []fingerprint.Stat) {
		t.Helper()
		if n := len(aliveOf(ms)); n != len(ms) || len(stoppedOf(ms)) > 0 {
			t.Fatalf("%s: the tree was signalled (%d of %d alive)", what, n, len(ms))
		}
	}

	contradicted := 0
	for _, c := range []struct{ name, id string }{{"live conmon", withConmon}, {"live ledger init", withInit}} {
		t.Run("one tree: "+c.name, func(t *testing.T) {
			stray := newCID(t)
			strayTree := tree(stray)
			rep, r := reconcile(c.id, stray)
			if r.Code != 0 || !rep.LivenessKnown {
				t.Fatalf("exit %d (known %v), want 0: %s", r.Code, rep.LivenessKnown, r.Stderr)
			}
			if a := rep.action(trees[c.id][0].PID); a != "skipped-contradicted" {
				t.Errorf("contradicted tree: action %q, want skipped-contradicted\n%s", a, r.Stdout)
			} else {
				contradicted++
			}
			intact(c.name, trees[c.id])
			if a := rep.action(strayTree[0].PID); a != "reaped" && a != "gone" {
				t.Errorf("uncontradicted stray: action %q, want reaped\n%s", a, r.Stdout)
			}
			if !waitAllDead(strayTree, 5*time.Second) {
				t.Errorf("the uncontradicted stray is alive: the wrong store's [] was not acted on")
			}
		})
	}
	report(t, "wrong-store", "single_contradictions_skipped", strconv.Itoa(contradicted)+"/2")

	t.Run("two trees: wrong store, exit 3", func(t *testing.T) {
		stray := newCID(t)
		strayTree := tree(stray)
		rep, r := reconcile(withConmon, withInit, stray)
		if r.Code != 3 || rep.LivenessKnown {
			t.Fatalf("exit %d (known %v), want 3: %s\n%s", r.Code, rep.LivenessKnown, r.Stderr, r.Stdout)
		}
		if !strings.Contains(r.Stderr, "wrong store") {
			t.Errorf("stderr does not name the wrong store: %s", r.Stderr)
		}
		intact("conmon", trees[withConmon])
		intact("ledger init", trees[withInit])
		intact("stray (nothing touched in an unknown run)", strayTree)
		report(t, "wrong-store", "two_contradictions_exit", r.Code)
		report(t, "wrong-store", "run_seconds", r.Took.Seconds())
	})
	if st := store.State(t, withConmon); st != "running" {
		t.Errorf("the real container is %s", st)
	}
}
