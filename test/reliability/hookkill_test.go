//go:build reliability

package reliability

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const hookKillComm = "kcrel-hkill"

// TestHookKilledMidRun SIGKILLs kc-hook poststop at random points of its
// run (start-up, scan, recording, SIGTERM, grace, SIGKILL, outcome), many
// times, on real supervisor trees (fake kcserver, a kernel, a kernel that
// ignores SIGTERM). After each kill: every ledger record still parses, and
// the next kc-janitor reconcile --apply reaps every process the hook left —
// including kernels whose anchor the hook had already killed, which only
// the ledger still ties to the container.
func TestHookKilledMidRun(t *testing.T) {
	state := t.TempDir()
	env := baseEnv(noContainersPodman(t)+":/usr/bin:/bin", "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+hookKillComm, "KC_KILL_GRACE=60ms")
	store, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}

	// A supervisor (the anchor), a kernel, and a kernel that ignores
	// SIGTERM (so the hook's run spans the whole grace).
	startTree := func(cid string) []fingerprint.Stat {
		sup := startSupervisor(t, hookKillComm, cid, &syscall.SysProcAttr{Setpgid: true})
		kernel := startKernel(t, inGroup(sup.PID))
		stubborn, err := startChild("/bin/sh", []string{"sh", "-c", `trap "" TERM; exec sleep 1000000`}, inGroup(sup.PID))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stubborn.Kill)
		ms := []fingerprint.Stat{sup.Stat, kernel.Stat}
		proc.WaitFor(t, 10*time.Second, "the stubborn kernel to exec sleep", func() bool {
			st, err := fingerprint.ReadStat(procRoot, stubborn.PID)
			if err != nil || st.Comm != "sleep" {
				return false
			}
			ms = append(ms, st)
			return true
		})
		return ms
	}

	// How long an undisturbed poststop takes: the kill points are spread
	// over it (and a little past it).
	var full time.Duration
	for range 3 {
		cid := newCID(t)
		ms := startTree(cid)
		r := runTool(t, hookBin(t), env, hookState(cid), "poststop")
		if r.Code != 0 || !waitAllDead(ms, 5*time.Second) {
			t.Fatalf("undisturbed poststop: exit %d, alive %v: %s", r.Code, aliveOf(ms), r.Stderr)
		}
		full = max(full, r.Took)
	}

	const trials = 50
	phases := map[string]int{}
	left, reaped, torn, temps := 0, 0, 0, 0
	for i := 0; i < trials; i++ {
		cid := newCID(t)
		ms := startTree(cid)
		// A third of the kills land in the first 30ms (start-up, scan,
		// recording), the rest anywhere in the run.
		limit := full
		if i%3 == 0 {
			limit = 30 * time.Millisecond
		}
		delay := time.Duration(rand.Int64N(int64(limit)))

		cmd := exec.Command(hookBin(t), "poststop")
		cmd.Env = env
		cmd.Stdin = strings.NewReader(hookState(cid))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		timer := time.AfterFunc(delay, func() { cmd.Process.Kill() }) // a pidfd: never another process
		err := cmd.Wait()
		timer.Stop()
		var ee *exec.ExitError
		killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()

		// Where did the kill land? The ledger says.
		phase := "hook finished first"
		if killed {
			rec, err := store.Load(cid)
			switch {
			case errors.Is(err, os.ErrNotExist), err == nil && rec.Stages["poststop"].IsZero():
				phase = "killed before recording the trees"
			case rec.Outcome == "":
				phase = "killed after recording, while reaping"
			case err != nil:
				t.Fatalf("record of %s: %v", cid, err)
			default:
				phase = "killed after recording the outcome"
			}
		}
		phases[phase]++
		if len(aliveOf(ms)) > 0 {
			left++
		}

		// The ledger is never torn: every record parses, strictly.
		n, bad := checkLedger(t, state)
		torn += bad
		temps = max(temps, n)
		if _, errs := store.List(); len(errs) > 0 {
			torn += len(errs)
			t.Errorf("trial %d (%s): unreadable records: %v", i, phase, errs)
		}

		// The next reconcile reaps whatever the hook left.
		r := runTool(t, janitorBin(t), env, "", append([]string{"reconcile", "--apply", "--format", "json", "--min-age", "0s",
			"--kill-grace", "60ms", "--container", cid}, janitorGround()...)...)
		if r.Code != 0 {
			t.Errorf("trial %d (%s): reconcile exit %d: %s", i, phase, r.Code, r.Stderr)
		}
		if waitAllDead(ms, 5*time.Second) {
			reaped++
		} else {
			t.Errorf("trial %d (%s, kill after %v): reconcile left %v alive\n%s", i, phase, delay, aliveOf(ms), r.Stdout)
		}
	}

	const area = "hook-killed"
	report(t, area, "trials", trials)
	report(t, area, "undisturbed_poststop_ms", full.Milliseconds())
	report(t, area, "kill_points", phases)
	report(t, area, "trials_with_strays_left_by_the_hook", left)
	report(t, area, "trials_fully_reaped_by_next_reconcile", reaped)
	report(t, area, "torn_or_unreadable_records", torn)
	report(t, area, "max_leftover_temp_files", temps)
	if torn != 0 || reaped != trials {
		t.Errorf("torn records %d, reaped %d/%d", torn, reaped, trials)
	}
	if left == 0 {
		t.Errorf("no kill left anything behind: the kill points missed the reaping")
	}
}

// checkLedger parses every record file in the ledger strictly and returns
// the number of temporary files lying around and of records that do not
// parse.
func checkLedger(t testing.TB, state string) (temps, bad int) {
	t.Helper()
	dir := filepath.Join(state, "containers")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			temps++
		case strings.HasSuffix(name, ".json"):
			data, err := os.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			var rec ledger.Record
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			if err == nil {
				err = dec.Decode(&rec)
			}
			if err == nil && dec.More() {
				err = errors.New("trailing data")
			}
			if err == nil && rec.ContainerID+".json" != name {
				err = errors.New("container id does not match the file name")
			}
			if err != nil {
				bad++
				t.Errorf("ledger record %s: %v", name, err)
			}
		}
	}
	return temps, bad
}
