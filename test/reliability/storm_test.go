//go:build reliability

package reliability

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const stormComm = "kcrel-storm"

// installHook installs the repository's hooks.d descriptors into the
// Env's hooks dir, rewritten as `make install` rewrites them, with env
// added (KC_STATE_DIR and the like). It returns the descriptor timeout.
func installHook(t testing.TB, e *podmantest.Env, env ...string) int {
	t.Helper()
	descs, err := filepath.Glob("../../hooks.d/*.json")
	if err != nil || len(descs) == 0 {
		t.Fatalf("no descriptors in hooks.d: %v", err)
	}
	timeout := 0
	for _, d := range descs {
		var desc map[string]any
		data, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &desc); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		h := desc["hook"].(map[string]any)
		h["path"] = hookBin(t)
		var all []any
		for _, kv := range env {
			all = append(all, kv)
		}
		h["env"] = append(all, h["env"].([]any)...)
		if to, ok := h["timeout"].(float64); ok {
			timeout = int(to)
		}
		out, _ := json.Marshal(desc)
		if err := os.WriteFile(filepath.Join(e.HooksDir(), filepath.Base(d)), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return timeout
}

// hookLogLine is one "poststop done" line of kc-hook's JSON log.
type hookLogLine struct {
	Msg        string `json:"msg"`
	Container  string `json:"container"`
	Stage      string `json:"stage"`
	DurationMS int64  `json:"duration_ms"`
	Failed     bool   `json:"failed"`
	Trees      int    `json:"trees"`
}

func readHookLog(t testing.TB, path string) []hookLogLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []hookLogLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l hookLogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("hook log line %q: %v", sc.Text(), err)
			continue
		}
		out = append(out, l)
	}
	return out
}

// TestStopStorm stops 32 real containers at once, each with a supervisor
// tree that outlives SIGTERM: every tree is reaped by its poststop hook,
// every ledger record is valid, and no hook comes near its timeout.
func TestStopStorm(t *testing.T) {
	const n = 32
	e := podmantest.New(t)
	state := t.TempDir()
	timeout := installHook(t, e, "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+stormComm, "KC_KILL_GRACE=1s")

	// Start the containers, four at a time.
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out, err := e.Podman("run", "-d", "--network", "none", "--rootfs", e.Rootfs(), "/bin/sleep", "100000")
			if err != nil {
				errs <- err
				return
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			ids[i] = strings.TrimSpace(lines[len(lines)-1])
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// A tree per container: a supervisor, a kernel, a kernel that
	// ignores SIGTERM.
	trees := make([][]fingerprint.Stat, n)
	for i, id := range ids {
		sup := startSupervisor(t, stormComm, id, &syscall.SysProcAttr{Setpgid: true})
		kernel := startKernel(t, inGroup(sup.PID))
		stubborn, err := startChild("/bin/sh", []string{"sh", "-c", `trap "" TERM; exec sleep 1000000`}, inGroup(sup.PID))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stubborn.Kill)
		trees[i] = []fingerprint.Stat{sup.Stat, kernel.Stat}
		proc.WaitFor(t, 10*time.Second, "the stubborn kernel", func() bool {
			st, err := fingerprint.ReadStat(procRoot, stubborn.PID)
			if err == nil && st.Comm == "sleep" {
				trees[i] = append(trees[i], st)
				return true
			}
			return false
		})
	}

	// The storm: every container stopped at the same moment.
	start := time.Now()
	stopErrs := make([]error, n)
	release := make(chan struct{})
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			_, stopErrs[i] = e.Podman("stop", "-t", "0", id)
		}()
	}
	close(release)
	wg.Wait()
	stormTook := time.Since(start)
	failedStops := 0
	for i, err := range stopErrs {
		if err != nil {
			failedStops++
			t.Errorf("podman stop %s: %v", ids[i][:12], err)
		}
	}

	// Every tree reaped.
	reaped := 0
	for i, tr := range trees {
		if waitAllDead(tr, 10*time.Second) {
			reaped++
		} else {
			t.Errorf("container %s: tree still alive: %v", ids[i][:12], aliveOf(tr))
		}
	}

	// Every record valid and saying so.
	store, err := ledger.OpenReadOnly(state)
	if err != nil {
		t.Fatal(err)
	}
	_, bad := checkLedger(t, state)
	recs, lerrs := store.List()
	bad += len(lerrs)
	outcomes := map[string]int{}
	for _, r := range recs {
		outcomes[r.Outcome]++
		if r.Stages["createRuntime"].IsZero() || r.Stages["poststop"].IsZero() {
			t.Errorf("record %s: stages %v", r.ContainerID[:12], r.Stages)
		}
	}
	if len(recs) != n || outcomes["reaped"] != n {
		t.Errorf("%d records, outcomes %v; want %d reaped", len(recs), outcomes, n)
	}

	// No hook past its timeout (nor its own deadline).
	var slowest time.Duration
	var slowestID string
	seen := map[string]bool{}
	for _, l := range readHookLog(t, filepath.Join(state, "kc-hook.log")) {
		if l.Msg != "poststop done" {
			continue
		}
		seen[l.Container] = true
		d := time.Duration(l.DurationMS) * time.Millisecond
		if d > slowest {
			slowest, slowestID = d, l.Container
		}
		if l.Failed {
			t.Errorf("poststop of %s failed", l.Container[:12])
		}
	}
	if len(seen) != n {
		t.Errorf("poststop logged for %d containers, want %d", len(seen), n)
	}
	if timeout == 0 || slowest >= time.Duration(timeout)*time.Second || slowest >= 20*time.Second {
		t.Errorf("slowest hook %v against a timeout of %ds and a deadline of 20s", slowest, timeout)
	}

	const area = "storm"
	report(t, area, "containers_stopped_at_once", n)
	report(t, area, "stop_storm_seconds", stormTook.Round(time.Millisecond).Seconds())
	report(t, area, "failed_stops", failedStops)
	report(t, area, "trees_reaped", fmt.Sprintf("%d/%d", reaped, n))
	report(t, area, "records", len(recs))
	report(t, area, "invalid_records", bad)
	report(t, area, "record_outcomes", outcomes)
	report(t, area, "slowest_hook_seconds", slowest.Round(time.Millisecond).Seconds())
	report(t, area, "slowest_hook_container", slowestID[:min(12, len(slowestID))])
	report(t, area, "hook_timeout_seconds", timeout)
}
