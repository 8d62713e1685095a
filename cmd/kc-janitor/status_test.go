package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/janitor"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestStatus: podman unreachable, a ledger with one record, one orphan
// socket: status shows all three, exits 0, and writes nothing.
func TestStatus(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	st, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("5", 64)
	if err := st.Update(id, func(r *ledger.Record) error {
		r.Stages = map[string]time.Time{"createRuntime": time.Now().Add(-time.Hour), "poststop": time.Now()}
		r.Outcome = "reaped"
		r.Trees = []ledger.Tree{{PGID: 77, Members: []ledger.Process{{PID: 77}, {PID: 78}}}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	socks := t.TempDir()
	sock := orphanSock(t, socks, goneSockName(t))
	t.Setenv("PATH", t.TempDir())
	base := []string{"status", "--state-dir", state, "--socket-dir", socks, "--podman-url", "unix:///nonexistent/podman.sock",
		"--container", id} // only this test's records and trees

	code, out := runJanitorCapture(t, append(base, "--format", "json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := sortedKeys(raw); !reflect.DeepEqual(got, []string{"errors", "liveness_known", "records", "sockets", "source", "state_dir", "trees"}) {
		t.Errorf("keys %v", got)
	}
	var rep janitor.StatusReport
	json.Unmarshal([]byte(out), &rep)
	if rep.LivenessKnown || len(rep.Records) != 1 || len(rep.Sockets) != 1 || len(rep.Errors) == 0 {
		t.Fatalf("%+v", rep)
	}
	r := rep.Records[0]
	if r.ContainerID != id || !r.CurrentBoot || r.Outcome != "reaped" || r.Trees != 1 || r.Members != 2 || len(r.Stages) != 2 || r.ContainerNow != "?" {
		t.Errorf("record %+v", r)
	}
	if s := rep.Sockets[0]; s.Path != sock || s.Verdict != "stale" || s.Action != "would-unlink" {
		t.Errorf("socket %+v", s)
	}

	code, out = runJanitorCapture(t, base...)
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"LEDGER " + state + ": 1 record", id[:12], "createRuntime,poststop", "reaped",
		"TREES (ground truth unknown: an engine did not answer, or local evidence contradicts its answer; see PROBLEMS)", "SOCKETS: 1 socket", sock, "stale", "PROBLEMS"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if r2, _ := st.Load(id); !r2.UpdatedAt.Equal(r.UpdatedAt) {
		t.Error("status wrote the ledger")
	}
}

// TestStatusShowsEngine: a running Docker container with a ledger record
// and a supervisor tree on the host, and a record of a container no
// engine lists: status names docker as the engine of the first's rows
// (JSON "engine" and the ENGINE column), none for the second.
func TestStatusShowsEngine(t *testing.T) {
	dk := dockertest.Need(t)
	id := dk.Run(t, nil)
	gone := strings.Repeat("6", 64)
	state := filepath.Join(t.TempDir(), "state")
	st, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{id, gone} {
		if err := st.Update(cid, func(r *ledger.Record) error {
			r.Stages = map[string]time.Time{"createRuntime": time.Now()}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, InitPID: dk.InitPID(t, id)})
	base := []string{"status", "--state-dir", state, "--socket-dir", t.TempDir(), "--engine", "docker", "--docker-url", dk.URL,
		"--min-age", "0s", "--container", id, "--container", gone}

	code, out := runJanitorCapture(t, append(base, "--format", "json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var rep janitor.StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !rep.LivenessKnown || len(rep.Records) != 2 || len(rep.Trees) != 1 {
		t.Fatalf("want ground truth, 2 records, 1 tree: %s", out)
	}
	for _, r := range rep.Records {
		want := map[string][2]string{id: {"docker", "running"}, gone: {"", "gone"}}[r.ContainerID]
		if r.Engine != want[0] || r.ContainerNow != want[1] {
			t.Errorf("record %.12s: engine %q state %q, want %q %q", r.ContainerID, r.Engine, r.ContainerNow, want[0], want[1])
		}
	}
	if tr := rep.Trees[0]; tr.ContainerID != id || tr.Engine != "docker" || tr.PGID != k.PGID || tr.Action != "skipped-live" || tr.Decision != tr.Action {
		t.Errorf("tree %+v, want container %.12s, engine docker, pgid %d, skipped-live", tr, id, k.PGID)
	}

	code, out = runJanitorCapture(t, base...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, re := range []string{
		`(?m)^CONTAINER\s+ENGINE\s+NOW\s`,
		`(?m)^CONTAINER\s+ENGINE\s+STATE\s`,
		`(?m)^` + id[:12] + `\s+docker\s+running\s+createRuntime`,
		`(?m)^` + gone[:12] + `\s+-\s+gone\s`,
		`(?m)^` + id[:12] + `\*?\s+docker\s+running\s+` + strconv.Itoa(k.PGID) + `\s`,
		`TREES \(docker api, \d+ live containers\)`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no %s in:\n%s", re, out)
		}
	}
}

// TestStatusTreeAction: a tree's decision is under "action", the key
// reconcile's JSON gives it, and under "decision" (its former key, kept
// for one release) with the same value.
func TestStatusTreeAction(t *testing.T) {
	id := strings.Repeat("6", 64)
	testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id})
	t.Setenv("PATH", t.TempDir()) // no podman CLI
	code, out := runJanitorCapture(t, "status", "--state-dir", t.TempDir(), "--socket-dir", t.TempDir(),
		"--podman-url", "unix:///nonexistent/podman.sock", "--min-age", "0s", "--container", id, "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var raw struct {
		Trees []map[string]any `json:"trees"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(raw.Trees) != 1 {
		t.Fatalf("want the fake's tree: %s", out)
	}
	tr := raw.Trees[0]
	for _, tc := range []struct{ key, want string }{
		{"action", "?"}, // ground truth unknown: podman is not there
		{"decision", "?"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			if got, ok := tr[tc.key]; !ok || got != tc.want {
				t.Errorf("%s = %v (present %v), want %q: %v", tc.key, got, ok, tc.want, tr)
			}
		})
	}
}

// TestStatusLedgerNotThereYet: a state dir no hook has made yet (a Docker
// host, a fresh boot) is no problem; one that cannot be a ledger is.
func TestStatusLedgerNotThereYet(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stateDir string
		problem  bool
	}{
		{filepath.Join(dir, "not-yet"), false},
		{file, true},
	} {
		_, out := runJanitorCapture(t, "status", "--format", "json", "--state-dir", tc.stateDir, "--socket-dir", t.TempDir(), "--podman-url", "unix:///nonexistent.sock", "--engine", "podman")
		var rep struct{ Errors []string }
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		problem := slices.ContainsFunc(rep.Errors, func(e string) bool { return strings.HasPrefix(e, "ledger: ") })
		if problem != tc.problem {
			t.Errorf("state dir %s: ledger problem %v, want %v (errors %q)", tc.stateDir, problem, tc.problem, rep.Errors)
		}
	}
}

// TestStatusQuiet: for cron, -q prints the look only when it has PROBLEMS.
func TestStatusQuiet(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"status", "-q", "--socket-dir", t.TempDir(), "--engine", "docker"}
	u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `[]`) })
	if code, out := runJanitorCapture(t, append(base, "--docker-url", u, "--state-dir", filepath.Join(dir, "new"))...); code != exitOK || out != "" {
		t.Errorf("no problems: exit %d, printed %q", code, out)
	}
	if _, out := runJanitorCapture(t, append(base, "--docker-url", u, "--state-dir", file)...); !strings.Contains(out, "PROBLEMS") {
		t.Errorf("a problem, yet printed %q", out)
	}
}

// TestStatusScopedLeavesHostSockets: status and doctor scoped with
// --container do not widen to the host's socket dirs (DESIGN: a command
// never widens past the container named); they say so.
func TestStatusScopedLeavesHostSockets(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	id := strings.Repeat("6", 64)
	args := []string{"--format", "json", "--state-dir", filepath.Join(t.TempDir(), "state"), "--podman-url", "unix:///nonexistent/podman.sock", "--container", id}
	_, out := runJanitorCapture(t, append([]string{"status"}, args...)...)
	var rep janitor.StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.SocketsSkipped == "" || len(rep.Sockets) != 0 {
		t.Errorf("status --container: sockets_skipped %q, %d sockets; want skipped, none", rep.SocketsSkipped, len(rep.Sockets))
	}
	_, out = runJanitorCapture(t, append([]string{"doctor"}, args...)...)
	rep2 := decodeDoctor(t, out)
	for _, name := range []string{doctor.NameSockets, doctor.NameSessions} {
		if c := checkOf(t, rep2, name); !strings.Contains(c.Detail, "not looked at") {
			t.Errorf("doctor --container, %s: %s %q; want not looked at", name, c.Verdict, c.Detail)
		}
	}
}

// failingWriter fails every write, as stdout on a full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// noContainersPodman puts first on PATH a podman CLI whose answer is no
// container: the engine kc-janitor asks when the service's socket
// (--podman-url unix:///nonexistent/…) is missing.
func noContainersPodman(t *testing.T) {
	t.Helper()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "podman"), []byte("#!/bin/sh\necho '[]'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":/usr/bin:/bin")
}

// TestReportLostExitsFailed: a report that cannot be written (stdout on
// a full disk, a closed pipe) exits 1, not 0 (a clean run) nor 2 (a
// usage error).
func TestReportLostExitsFailed(t *testing.T) {
	noContainersPodman(t)
	id := strings.Repeat("6", 64)
	common := []string{"--state-dir", filepath.Join(t.TempDir(), "state"), "--podman-url", "unix:///nonexistent/podman.sock", "--engine", "podman"}
	for _, args := range [][]string{
		{"status", "--socket-dir", t.TempDir(), "--container", id},
		{"status", "--socket-dir", t.TempDir(), "--container", id, "--format", "json"},
		{"reconcile", "--container", id},
		{"reconcile", "--container", id, "--format", "json"},
	} {
		args = append(args[:1:1], append(append([]string(nil), common...), args[1:]...)...)
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			app := newApp()
			app.Writer, app.ErrWriter = failingWriter{}, io.Discard
			err := runApp(app, append([]string{"kc-janitor"}, args...))
			t.Logf("%v", err)
			var ec cli.ExitCoder
			if !errors.As(err, &ec) || ec.ExitCode() != exitFailed {
				t.Errorf("err %v; want exit %d", err, exitFailed)
			}
		})
	}
}

// TestStatusDecidesWithEvidence: status says what reconcile would decide,
// local evidence included: the tree of a container no engine lists but
// whose recorded init still runs here is skipped-contradicted, not a
// would-reap. Two such containers make the answer the wrong store's:
// then no tree's decision or container state is known ("?"), and no
// source is named; status exits 0 whatever it finds.
func TestStatusDecidesWithEvidence(t *testing.T) {
	noContainersPodman(t)
	for _, tc := range []struct {
		name      string
		ids       []string
		known     bool
		wantState string
		want      string
	}{
		{"one contradicted", []string{strings.Repeat("7a", 32)}, true, "gone", "skipped-contradicted"},
		{"two contradicted: the wrong store", []string{strings.Repeat("7e", 32), strings.Repeat("7f", 32)}, false, "?", "?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			store, err := ledger.Open(state)
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"status", "--state-dir", state, "--socket-dir", t.TempDir(), "--engine", "podman",
				"--podman-url", "unix:///nonexistent/podman.sock", "--podman-arg=--root=" + t.TempDir(), "--min-age", "0s", "--format", "json"}
			for _, id := range tc.ids {
				testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id})
				init := exec.Command("sleep", "1000")
				if err := init.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { init.Process.Kill(); init.Wait() })
				st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, init.Process.Pid)
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Update(id, func(r *ledger.Record) error {
					r.Init = &ledger.Process{PID: init.Process.Pid, StartTicks: st.StartTicks}
					r.Stages = map[string]time.Time{"createRuntime": time.Now()}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--container", id)
			}
			// --podman-arg makes the CLI's answer the store's own, ground
			// truth for root's trees (through --url alone it vouches for
			// none).
			code, out := runJanitorCapture(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, out)
			}
			var raw struct {
				Known  bool   `json:"liveness_known"`
				Source string `json:"source"`
				Trees  []struct {
					Action string `json:"action"`
					State  string `json:"container_state"`
				} `json:"trees"`
			}
			if err := json.Unmarshal([]byte(out), &raw); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if len(raw.Trees) != len(tc.ids) {
				t.Fatalf("trees %+v; want %d:\n%s", raw.Trees, len(tc.ids), out)
			}
			for _, tr := range raw.Trees {
				if tr.Action != tc.want || tr.State != tc.wantState {
					t.Errorf("tree %+v; want action %q, container state %q:\n%s", tr, tc.want, tc.wantState, out)
				}
			}
			if raw.Known != tc.known || (raw.Source == "") == tc.known {
				t.Errorf("liveness_known %v, source %q; want known %v, a source only then", raw.Known, raw.Source, tc.known)
			}
		})
	}
}

// TestStatusSaysReconcileWouldRefuse: where reconcile --apply would reap
// none of the strays (more than --max-reap), status says so beside its
// would-reap column, in the text and the JSON.
func TestStatusSaysReconcileWouldRefuse(t *testing.T) {
	noContainersPodman(t)
	var args []string
	for _, c := range []string{"7b", "7c", "7d"} {
		id := strings.Repeat(c, 32)
		testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id})
		args = append(args, "--container", id)
	}
	common := append([]string{"status", "--state-dir", filepath.Join(t.TempDir(), "state"), "--socket-dir", t.TempDir(), "--engine", "podman",
		"--podman-url", "unix:///nonexistent/podman.sock", "--podman-arg=--root=" + t.TempDir(), "--min-age", "0s", "--max-reap", "2"}, args...)
	code, out := runJanitorCapture(t, append(common, "--format", "json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var raw struct {
		Trees       []struct{ Action string } `json:"trees"`
		WouldRefuse string                    `json:"would_refuse"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(raw.Trees) != 3 || raw.WouldRefuse == "" {
		t.Errorf("trees %+v, would_refuse %q; want three would-reap trees and reconcile's refusal:\n%s", raw.Trees, raw.WouldRefuse, out)
	}
	if code, out := runJanitorCapture(t, common...); code != exitOK || !strings.Contains(out, "reconcile --apply would reap none of them") {
		t.Errorf("text: exit %d, want the refusal said:\n%s", code, out)
	}
}
