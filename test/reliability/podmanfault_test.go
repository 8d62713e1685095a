//go:build reliability

package reliability

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

const faultComm = "kcrel-fault"

// podmanFault is one way podman can fail to answer.
type podmanFault struct {
	name string
	api  string // "down", "hang" or "500"
	cli  string // shell body of the podman CLI, "" for no CLI at all
}

var podmanFaults = []podmanFault{
	{"API down, no CLI", "down", ""},
	{"API hangs, no CLI", "hang", ""},
	{"API answers 500, no CLI", "500", ""},
	{"API hangs, CLI hangs", "hang", "exec sleep 1000"},
	{"API down, CLI prints garbage", "down", "echo 'garbage{'"},
	{"API down, CLI exits 125", "down", "echo 'Error: cannot connect to Podman' >&2; exit 125"},
	{"API down, CLI prints nothing", "down", "exit 0"},
	{"API down, CLI prints a JSON object", "down", `echo '{"Id":"x","State":"running"}'`},
	{"API down, CLI prints entries without a State", "down", `echo '[{"Id":"` + strings.Repeat("ab", 32) + `"}]'`},
	{"API down, CLI killed by a signal", "down", "kill -9 $$"},
}

// fakeAPI serves the podman API socket badly: "hang" accepts connections
// and never answers, "500" answers every request with an error.
func fakeAPI(t testing.TB, mode string) string {
	t.Helper()
	sock := filepath.Join(shortDir(t, "kcrel-api-"), "podman.sock")
	if mode == "down" {
		return "unix://" + sock
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	switch mode {
	case "hang":
		var conns []net.Conn
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				conns = append(conns, c) // held open, never answered
			}
		}()
		t.Cleanup(func() {
			l.Close()
			<-done
			for _, c := range conns {
				c.Close()
			}
		})
	case "500":
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "{garbage", http.StatusInternalServerError)
		})}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return "unix://" + sock
}

// TestPodmanUnreachable: whatever way podman fails — API down, hanging or
// failing, CLI absent, hanging, exiting 125, printing garbage — reconcile
// --apply must touch nothing (no signal, no ledger write) and exit 3.
func TestPodmanUnreachable(t *testing.T) {
	cid := newCID(t)
	stray := startSupervisor(t, faultComm, cid, &syscall.SysProcAttr{Setpgid: true})
	kernel := startKernel(t, inGroup(stray.PID))
	watcher := mustBystander(t, inGroup(stray.PID), "")
	tree := []fingerprint.Stat{stray.Stat, kernel.Stat, watcher.Stat}

	// A ledger with a record: it must not change either.
	state := t.TempDir()
	if r := runTool(t, hookBin(t), baseEnv("/usr/bin:/bin", "KC_STATE_DIR="+state),
		`{"id":"`+cid+`","status":"creating"}`, "createRuntime"); r.Code != 0 {
		t.Fatalf("createRuntime: %d %s", r.Code, r.Stderr)
	}
	recPath := filepath.Join(state, "containers", cid+".json")
	before, err := os.Stat(recPath)
	if err != nil {
		t.Fatal(err)
	}
	noCLI := t.TempDir()

	const repeats = 3
	runs, exit3, touched := 0, 0, 0
	var slowest time.Duration
	for _, f := range podmanFaults {
		url := fakeAPI(t, f.api)
		path := noCLI
		if f.cli != "" {
			path = fakePodman(t, f.cli)
		}
		env := baseEnv(path, "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+faultComm)
		for i := 0; i < repeats; i++ {
			args := []string{"reconcile", "--apply", "--min-age", "0s", "--kill-grace", "200ms", "--podman-url", url,
				"--podman-timeout", "1s", "--container", cid}
			json := i != repeats-1 // the last run in text form
			if json {
				args = append(args, "--format", "json")
			}
			r := runTool(t, janitorBin(t), env, "", args...)
			runs++
			slowest = max(slowest, r.Took)
			if r.Code == 3 {
				exit3++
			} else {
				t.Errorf("%s: exit %d, want 3\nstdout: %s\nstderr: %s", f.name, r.Code, r.Stdout, r.Stderr)
			}
			if json {
				var rep reconcileJSON
				decodeJSON(t, r, &rep)
				if rep.LivenessKnown || len(rep.Trees) != 0 {
					t.Errorf("%s: report %+v", f.name, rep)
				}
			} else if !strings.Contains(r.Stdout, "nothing was touched") {
				t.Errorf("%s: text output %q", f.name, r.Stdout)
			}
			if n := len(aliveOf(tree)); n != len(tree) || len(stoppedOf(tree)) > 0 {
				touched++
				t.Errorf("%s: the tree was signalled (%d of %d alive)", f.name, n, len(tree))
			}
			if n, why := watcher.Harm(); n > 0 {
				touched += n
				t.Errorf("%s: %s", f.name, why)
			}
			if after, err := os.Stat(recPath); err != nil || !after.ModTime().Equal(before.ModTime()) {
				touched++
				t.Errorf("%s: the ledger record changed (%v)", f.name, err)
			}
		}
	}

	const area = "podman-unreachable"
	report(t, area, "fault_kinds", len(podmanFaults))
	report(t, area, "reconcile_apply_runs", runs)
	report(t, area, "runs_exiting_3", exit3)
	report(t, area, "runs_that_touched_anything", touched)
	report(t, area, "slowest_run_seconds", slowest.Round(time.Millisecond).Seconds())

	// doctor must warn about the same faults; with --fix it must touch
	// nothing either.
	r := runTool(t, janitorBin(t), baseEnv(noCLI, "KC_STATE_DIR="+state), "", "doctor", "--podman-url", fakeAPI(t, "down"))
	if strings.Contains(r.Stdout+r.Stderr, "not implemented") {
		report(t, area, "doctor", "not implemented yet: not checked")
		return
	}
	empty := t.TempDir()
	doctorRuns, warned := 0, 0
	for _, f := range podmanFaults {
		path := noCLI
		if f.cli != "" {
			path = fakePodman(t, f.cli)
		}
		r := runTool(t, janitorBin(t), baseEnv(path, "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+faultComm), "",
			"doctor", "--fix", "--format", "json", "--podman-url", fakeAPI(t, f.api), "--podman-timeout", "1s",
			"--container", cid, "--min-age", "0s", "--kill-grace", "200ms", "--socket-dir", empty, "--hooks-dir", empty)
		doctorRuns++
		var rep struct {
			Checks []struct{ Name, Verdict, Detail string }
			Worst  string
		}
		decodeJSON(t, r, &rep)
		podman := ""
		for _, c := range rep.Checks {
			if c.Name == "podman" {
				podman = c.Verdict
			}
		}
		if podman == "warn" && r.Code != 0 && rep.Worst != "ok" {
			warned++
		} else {
			t.Errorf("doctor with %s: exit %d, podman check %q\n%s%s", f.name, r.Code, podman, r.Stdout, r.Stderr)
		}
		if n := len(aliveOf(tree)); n != len(tree) || len(stoppedOf(tree)) > 0 {
			t.Errorf("%s: doctor --fix signalled the tree (%d of %d alive)", f.name, n, len(tree))
		}
		if n, why := watcher.Harm(); n > 0 {
			t.Errorf("%s: doctor --fix: %s", f.name, why)
		}
	}
	report(t, area, "doctor_fix_runs", doctorRuns)
	report(t, area, "doctor_runs_warning_podman", warned)
}
