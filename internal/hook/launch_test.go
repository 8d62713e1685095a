package hook

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// lcid is this test binary's own container ID: other packages' tests run
// trees and poststops for the shared test ID in parallel.
var lcid = func() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}()

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type launchEnv struct {
	cfg     Config
	log     *syncBuffer
	sockDir string
	store   *ledger.Store
}

// newLaunchEnv prepares a state dir, an allowlist with entry "fake" (the
// fake kcserver staying in the wrapper's group, one child) and points the
// hook at a built kc-hook. Cleanup kills every wrapper group the ledger
// ever named.
func newLaunchEnv(t *testing.T, allowlistMode os.FileMode) *launchEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bin := supervisetest.BuildKCHook(t)
	old := executable
	executable = func() (string, error) { return bin, nil }
	t.Cleanup(func() { executable = old })

	e := &launchEnv{log: &syncBuffer{}, sockDir: t.TempDir()}
	etc := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	allow := map[string]any{"supervisors": map[string]any{
		"fake": map[string]any{
			"argv": []string{testutil.BuildKCServer(t), "--transport", "socket", "--socket-dir=" + e.sockDir},
			"env":  []string{"FAKE_INIT={{init_pid}}", "KCFAKE_CHILDREN=1"},
		},
	}}
	data, _ := json.Marshal(allow)
	file := filepath.Join(etc, "supervisors.json")
	if err := os.WriteFile(file, data, allowlistMode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, allowlistMode); err != nil {
		t.Fatal(err)
	}
	e.cfg = Config{
		StateDir:        filepath.Join(t.TempDir(), "state"),
		Comms:           []string{"kcserver"},
		KillGrace:       time.Second,
		Deadline:        10 * time.Second,
		SupervisorsFile: file,
		Logger:          slogJSON(e.log),
	}
	var err error
	if e.store, err = ledger.Open(e.cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	var seen []int
	var mu sync.Mutex
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(SupervisorLog(e.cfg.StateDir, lcid))
			t.Logf("hook log:\n%s\nwrapper log:\n%s", e.log.String(), data)
		}
		mu.Lock()
		defer mu.Unlock()
		if rec, err := e.store.Load(lcid); err == nil && rec.Supervisor != nil {
			seen = append(seen, rec.Supervisor.PID)
		}
		for _, m := range pgkill.Members(fingerprint.DefaultRoot, seen...) {
			supervisetest.KillProcess(m)
		}
	})
	return e
}

func (e *launchEnv) state(pid int) *specs.State {
	return &specs.State{ID: lcid, Pid: pid, Bundle: "/b", Annotations: map[string]string{supervise.Annotation: "fake"}}
}

func (e *launchEnv) supervisor(t *testing.T) *ledger.Process {
	t.Helper()
	rec, err := e.store.Load(lcid)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Supervisor
}

// wrappers lists the live supervisor trees of lcid that hold a wrapper.
func wrappers(t *testing.T) []trees.Tree {
	t.Helper()
	found, _, err := trees.Scan(trees.Options{Comms: []string{"kcserver"}})
	if err != nil {
		t.Fatal(err)
	}
	var out []trees.Tree
	for _, tr := range found {
		if tr.ContainerID == lcid && slices.ContainsFunc(tr.Members, func(m fingerprint.Identity) bool { return m.Comm == trees.WrapperComm }) {
			out = append(out, tr)
		}
	}
	return out
}

func TestLaunchRefused(t *testing.T) {
	for _, tc := range []struct {
		name, annotation string
		mode             os.FileMode
		want             string
	}{
		{"not allowlisted", "/bin/sh -c 'rm -rf /'", 0o644, "not in the allowlist"},
		{"unknown name", "other", 0o644, "not in the allowlist"},
		{"world-writable allowlist", "fake", 0o666, "allowlist unusable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLaunchEnv(t, tc.mode)
			_, init := supervisetest.Process(t, "sleep", "1000000")
			st := e.state(init.PID)
			st.Annotations[supervise.Annotation] = tc.annotation
			if err := Record(e.cfg, StageCreateRuntime, st); err != nil {
				t.Fatalf("Record failed (the container must start anyway): %v", err)
			}
			rec, err := e.store.Load(lcid)
			if err != nil || rec.Init == nil || rec.Init.PID != init.PID {
				t.Fatalf("init not recorded: %+v %v", rec, err)
			}
			if rec.Supervisor != nil {
				t.Fatalf("a supervisor was launched: %+v", rec.Supervisor)
			}
			if log := e.log.String(); !strings.Contains(log, "supervisor refused") || !strings.Contains(log, tc.want) || !strings.Contains(log, `"level":"ERROR"`) {
				t.Fatalf("refusal not logged as an error with %q:\n%s", tc.want, log)
			}
			if ws := wrappers(t); len(ws) != 0 {
				t.Fatalf("wrapper trees: %+v", ws)
			}
		})
	}
}

// TestLaunchNotNearTheDeadline: a pre-start stage gives up at its
// deadline, whatever is under way; a supervisor is not launched so near
// it that the exit could land between the wrapper's start and its
// record, and one allowlisted is launched with time left.
func TestLaunchNotNearTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		left   time.Duration
		launch bool
	}{
		{"too near", time.Second, false},
		{"time left", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLaunchEnv(t, 0o644)
			e.cfg.Until = time.Now().Add(tc.left)
			_, init := supervisetest.Process(t, "sleep", "1000000")
			if err := Record(e.cfg, StageCreateRuntime, e.state(init.PID)); err != nil {
				t.Fatalf("Record failed (the container must start anyway): %v", err)
			}
			if s := e.supervisor(t); (s != nil) != tc.launch {
				t.Fatalf("supervisor %+v, want launched: %v; log:\n%s", s, tc.launch, e.log.String())
			}
			if !tc.launch && !strings.Contains(e.log.String(), "deadline is too near") {
				t.Errorf("not said why:\n%s", e.log.String())
			}
		})
	}
}

func TestNoAnnotationNoSupervisor(t *testing.T) {
	e := newLaunchEnv(t, 0o644)
	_, init := supervisetest.Process(t, "sleep", "1000000")
	st := e.state(init.PID)
	st.Annotations = nil
	if err := Record(e.cfg, StageCreateRuntime, st); err != nil {
		t.Fatal(err)
	}
	if s := e.supervisor(t); s != nil {
		t.Fatalf("supervisor launched without the annotation: %+v", s)
	}
	if strings.Contains(e.log.String(), "supervisor") {
		t.Fatalf("unexpected log:\n%s", e.log.String())
	}
}

// TestLaunchOnePerContainer: createRuntime launches the wrapper (a
// supervisor tree with the container ID in argv), poststart for the same
// init does not launch another, a new init (restart whose poststop never
// ran) replaces it, and poststop reaps what is left.
func TestLaunchOnePerContainer(t *testing.T) {
	e := newLaunchEnv(t, 0o644)
	_, init1 := supervisetest.Process(t, "sleep", "1000000")

	start := time.Now()
	if err := Record(e.cfg, StageCreateRuntime, e.state(init1.PID)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Record took %v: the hook must not wait for the supervisor", d)
	}
	w1 := e.supervisor(t)
	if w1 == nil {
		t.Fatalf("no supervisor recorded; log:\n%s", e.log.String())
	}
	if w1.Comm != trees.WrapperComm {
		t.Errorf("wrapper comm %q, want %q", w1.Comm, trees.WrapperComm)
	}
	w1st := fingerprint.Stat{PID: w1.PID, StartTicks: w1.StartTicks}
	id, err := fingerprint.Read(fingerprint.DefaultRoot, w1.PID)
	if err != nil {
		t.Fatal(err)
	}
	if id.PGID != w1.PID || id.SID != w1.PID || !slices.Contains(id.Argv, lcid) {
		t.Fatalf("wrapper is not a session leader carrying the container ID: %+v", id)
	}
	supervisetest.Eventually(t, 15*time.Second, "wrapper tree with the fake never appeared", func() bool {
		ws := wrappers(t)
		return len(ws) == 1 && ws[0].PGID == w1.PID && len(ws[0].Members) == 3 // wrapper, fake, child
	})
	// The wrapper's lines reach its log through the pipe that caps it,
	// a moment after its command runs.
	supervisetest.Eventually(t, 15*time.Second, "wrapper log lacks its start", func() bool {
		logData, _ := os.ReadFile(SupervisorLog(e.cfg.StateDir, lcid))
		return strings.Contains(string(logData), "command started")
	})
	env, _ := os.ReadFile("/proc/" + itoa(w1.PID) + "/environ")
	if !bytes.Contains(env, []byte("FAKE_INIT="+itoa(init1.PID)+"\x00")) {
		t.Errorf("allowlist env with placeholder not passed: %q", env)
	}

	// poststart for the same init: nothing new.
	if err := Record(e.cfg, StagePoststart, e.state(init1.PID)); err != nil {
		t.Fatal(err)
	}
	if w := e.supervisor(t); w == nil || w.PID != w1.PID {
		t.Fatalf("supervisor changed on poststart: %+v", w)
	}
	if !strings.Contains(e.log.String(), "already running") {
		t.Errorf("log:\n%s", e.log.String())
	}

	// A new init while the old wrapper is still alive (its init too): the
	// old wrapper's group is taken down, a new one is launched.
	_, init2 := supervisetest.Process(t, "sleep", "1000000")
	old := pgkill.Members(fingerprint.DefaultRoot, w1.PID)
	if err := Record(e.cfg, StageCreateRuntime, e.state(init2.PID)); err != nil {
		t.Fatal(err)
	}
	w2 := e.supervisor(t)
	if w2 == nil || w2.PID == w1.PID {
		t.Fatalf("no new supervisor: %+v; log:\n%s", w2, e.log.String())
	}
	for _, m := range old {
		if !supervisetest.Dead(m) {
			t.Errorf("member %d (%s) of the old wrapper's group survived", m.PID, m.Comm)
		}
	}
	if !supervisetest.Dead(w1st) {
		t.Fatal("old wrapper alive")
	}
	supervisetest.Eventually(t, 15*time.Second, "not exactly one wrapper tree, the new one", func() bool {
		ws := wrappers(t)
		return len(ws) == 1 && ws[0].PGID == w2.PID && len(ws[0].Members) == 3
	})

	// poststop reaps the tree (the first prevention layer).
	members := pgkill.Members(fingerprint.DefaultRoot, w2.PID)
	res, err := Poststop(context.Background(), e.cfg, &specs.State{ID: lcid})
	if err != nil || res.Failed || len(res.Trees) != 1 || res.Trees[0].Action != action.Reaped {
		t.Fatalf("poststop: %+v, %v", res, err)
	}
	for _, m := range members {
		if !supervisetest.Dead(m) {
			t.Errorf("member %d (%s) survived poststop", m.PID, m.Comm)
		}
	}
}

// TestWrapperExitsWithInit: the launched wrapper takes its tree down when
// the container's init dies, with no poststop at all.
func TestWrapperExitsWithInit(t *testing.T) {
	e := newLaunchEnv(t, 0o644)
	_, init := supervisetest.Process(t, "sleep", "1000000")
	if err := Record(e.cfg, StageCreateRuntime, e.state(init.PID)); err != nil {
		t.Fatal(err)
	}
	w := e.supervisor(t)
	if w == nil {
		t.Fatalf("no supervisor; log:\n%s", e.log.String())
	}
	var members []fingerprint.Stat
	supervisetest.Eventually(t, 15*time.Second, "tree incomplete", func() bool {
		members = pgkill.Members(fingerprint.DefaultRoot, w.PID)
		return len(members) == 3
	})
	supervisetest.KillProcess(init)
	supervisetest.Eventually(t, 10*time.Second, "tree outlived the container's init", func() bool {
		for _, m := range members {
			if !supervisetest.Dead(m) {
				return false
			}
		}
		return true
	})
}

func slogJSON(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestRecordCgroups: createRuntime records the init's cgroups, the
// container's own, that the janitor matches evidence of running against
// (DESIGN "Ground truth must be corroborated").
func TestRecordCgroups(t *testing.T) {
	e := newLaunchEnv(t, 0o644)
	_, init := supervisetest.Process(t, "sleep", "1000000")
	st := e.state(init.PID)
	st.Annotations = nil
	if err := Record(e.cfg, StageCreateRuntime, st); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Load(lcid)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", init.PID))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Fields(string(data)); len(rec.Cgroups) == 0 || !slices.Equal(rec.Cgroups, want) {
		t.Fatalf("recorded cgroups %q, want %q", rec.Cgroups, want)
	}
}
