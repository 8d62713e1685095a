package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// superviseEnv is a private podman with kc-hook installed and an
// allowlist naming one supervisor, "fake": the shipped example's
// "kallichore" entry with the fake kcserver as argv[0] and two kernels.
type superviseEnv struct {
	pm    *podmantest.Env
	state string
	// sockDir replaces the example's --socket-dir /tmp, so the sockets
	// of the supervisors the tests start (and kill) go with the test.
	sockDir string

	mu  sync.Mutex
	ids []string
}

// newSuperviseEnv installs the descriptors for stages (both by default).
// Cleanup SIGKILLs, by identity, whatever is left of the trees of every
// container the test ran (before podmantest removes the containers).
func newSuperviseEnv(t *testing.T, stages ...string) *superviseEnv {
	t.Helper()
	return newSuperviseEnvWith(t, nil, stages...)
}

// newSuperviseEnvWith is newSuperviseEnv with more of the fake's knobs
// (KCFAKE_*) in the supervisor's environment.
func newSuperviseEnvWith(t *testing.T, fakeEnv []string, stages ...string) *superviseEnv {
	t.Helper()
	s := &superviseEnv{pm: podmantest.New(t), state: t.TempDir(), sockDir: t.TempDir()}
	etc := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	al := exampleAllowlist(t, s.sockDir)
	fake := al["supervisors"].(map[string]any)["fake"].(map[string]any)
	fake["env"] = append(fake["env"].([]string), fakeEnv...)
	data, _ := json.Marshal(al)
	file := filepath.Join(etc, "supervisors.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	installHook(t, s.pm, s.state, "KC_SUPERVISORS_FILE="+file)
	if len(stages) > 0 {
		descs, _ := filepath.Glob(filepath.Join(s.pm.HooksDir(), "kc-hook-*.json"))
		for _, d := range descs {
			keep := false
			for _, st := range stages {
				keep = keep || strings.EqualFold(filepath.Base(d), "kc-hook-"+st+".json")
			}
			if !keep {
				if err := os.Remove(d); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		found, _, _ := trees.Scan(trees.Options{Comms: []string{"kcserver"}})
		for _, tr := range found {
			if slices.Contains(s.ids, tr.ContainerID) {
				killGroup(tr.Stats())
			}
		}
		// Kernels of a dead supervisor no longer look like a tree; the
		// ledger snapshots name them.
		if store, err := ledger.OpenReadOnly(s.state); err == nil {
			for _, id := range s.ids {
				rec, err := store.Load(id)
				if err != nil {
					continue
				}
				for _, lt := range rec.Trees {
					for _, m := range lt.Members {
						killGroup([]fingerprint.Stat{{PID: m.PID, StartTicks: m.StartTicks}})
					}
				}
			}
		}
		for _, id := range s.ids {
			testutil.RemoveContainCgroups(t, id)
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(s.state, "kc-hook.log"))
			t.Logf("kc-hook.log:\n%s", log)
			for _, id := range s.ids {
				w, _ := os.ReadFile(filepath.Join(s.state, "supervisors", id+".log"))
				t.Logf("supervisor log of %.12s:\n%s", id, w)
			}
		}
	})
	return s
}

// run starts a container annotated with supervisor name.
func (s *superviseEnv) run(t *testing.T, name string) string {
	t.Helper()
	start := time.Now()
	id := s.pm.Run(t, "--annotation", supervise.Annotation+"="+name)
	t.Logf("podman run -d took %v", time.Since(start).Round(time.Millisecond))
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
	return id
}

// wrapperTrees returns the live supervisor trees of id that hold a
// kc-hook supervise wrapper, as the janitor's scan sees them.
func wrapperTrees(t *testing.T, id string) []trees.Tree {
	t.Helper()
	found, _, err := trees.Scan(trees.Options{Comms: []string{"kcserver"}})
	if err != nil {
		t.Fatal(err)
	}
	var out []trees.Tree
	for _, tr := range found {
		if tr.ContainerID == id && slices.ContainsFunc(tr.Members, func(m fingerprint.Identity) bool { return m.Comm == trees.WrapperComm }) {
			out = append(out, tr)
		}
	}
	return out
}

// waitTree waits for exactly one complete wrapper tree of id (wrapper,
// kcserver, two kernels) and returns it.
func waitTree(t *testing.T, id string) trees.Tree {
	t.Helper()
	var ts []trees.Tree
	deadline := time.Now().Add(20 * time.Second)
	for {
		ts = wrapperTrees(t, id)
		if len(ts) == 1 && len(ts[0].Members) == 4 {
			return ts[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("want one complete wrapper tree for %.12s, have %d: %+v", id, len(ts), ts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func member(tr trees.Tree, comm string) fingerprint.Identity {
	for _, m := range tr.Members {
		if m.Comm == comm {
			return m
		}
	}
	return fingerprint.Identity{}
}

// TestSupervisorStartsWithContainer: an annotated container starts → its
// supervisor tree appears, led by the wrapper (a session leader carrying
// the container ID as a whole argv element), with the supervisor's socket;
// the ledger names the wrapper; podman stop takes it all down.
func TestSupervisorStartsWithContainer(t *testing.T) {
	s := newSuperviseEnv(t)
	id := s.run(t, "fake")
	tr := waitTree(t, id)

	w := member(tr, trees.WrapperComm)
	if w.PID != tr.PGID || w.SID != w.PID || !tr.Signalable() || tr.ByLedger {
		t.Fatalf("wrapper %+v does not lead a signalable tree %+v", w.Stat, tr)
	}
	if !slices.Contains(w.Argv, id) {
		t.Errorf("wrapper argv lacks the container ID as an element: %q", w.Argv)
	}
	if spec, err := supervise.ParseArgv(w.Argv); err != nil || spec.Init.PID != s.pm.InitPID(t, id) {
		t.Errorf("wrapper watches %+v (err %v), container init is %d", spec.Init, err, s.pm.InitPID(t, id))
	}
	kc := member(tr, "kcserver")
	if want := exampleAllowlist(t, s.sockDir)["supervisors"].(map[string]any)["fake"].(map[string]any)["argv"].([]string); !slices.Equal(kc.Argv, want) {
		t.Errorf("supervisor argv %q, want the example's %q", kc.Argv, want)
	}
	// The control socket is where --socket-dir says (the example's /tmp,
	// where sweep looks by default, is the test's own dir here); real
	// kcserver would make no socket at all without --transport socket.
	sock := filepath.Join(s.sockDir, fmt.Sprintf("kc-%d.sock", kc.PID))
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("supervisor socket: %v", err)
	}
	store, err := ledger.OpenReadOnly(s.state)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(id)
	if err != nil || rec.Supervisor == nil || rec.Supervisor.PID != w.PID || rec.Supervisor.StartTicks != w.StartTicks {
		t.Fatalf("ledger supervisor = %+v (err %v), want %d", rec, err, w.PID)
	}

	s.pm.Stop(t, id)
	waitAllDead(t, tr.Stats(), 10*time.Second)
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket survived the stop: %v", err)
	}
}

// TestSupervisorDiesWithInit: with no poststop hook at all, SIGKILL to
// the container still takes the tree down within seconds: the wrapper
// watches the container's init through a pidfd.
func TestSupervisorDiesWithInit(t *testing.T) {
	s := newSuperviseEnv(t, "createruntime")
	id := s.run(t, "fake")
	tr := waitTree(t, id)
	start := time.Now()
	if _, err := s.pm.Podman("kill", "-s", "KILL", id); err != nil {
		t.Fatal(err)
	}
	waitAllDead(t, tr.Stats(), 5*time.Second)
	t.Logf("tree gone %v after podman kill", time.Since(start).Round(time.Millisecond))
	store, _ := ledger.OpenReadOnly(s.state)
	if rec, err := store.Load(id); err != nil || !slices.ContainsFunc(rec.Trees, func(lt ledger.Tree) bool {
		return lt.Source == supervise.SnapshotSource && lt.PGID == tr.PGID && lt.Action == "reaped"
	}) {
		t.Errorf("ledger has no reaped supervise snapshot of group %d: %+v, %v", tr.PGID, rec, err)
	}
}

// TestSupervisorPdeathsig: kill -9 of the wrapper → its child, the
// supervisor, dies too (PR_SET_PDEATHSIG); the container keeps running.
func TestSupervisorPdeathsig(t *testing.T) {
	s := newSuperviseEnv(t)
	id := s.run(t, "fake")
	tr := waitTree(t, id)
	w, kc := member(tr, trees.WrapperComm), member(tr, "kcserver")
	// The wrapper has recorded its whole group (DESIGN "Ledger").
	store, err := ledger.OpenReadOnly(s.state)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !snapshotHolds(store, id, tr) {
		if time.Now().After(deadline) {
			t.Fatalf("no ledger snapshot of the whole tree %+v", tr.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	killGroup([]fingerprint.Stat{w.Stat})
	waitAllDead(t, []fingerprint.Stat{w.Stat, kc.Stat}, 5*time.Second)
	if st := s.pm.State(t, id); st != "running" {
		t.Errorf("container is %s", st)
	}
	// The kernels outlive both; nothing in their argv names the
	// container any more, but the wrapper's ledger snapshot does: the
	// poststop hook reaps them by exact identity.
	kernels := aliveOf(tr.Stats())
	if len(kernels) != 2 {
		t.Fatalf("want the 2 kernels left, have %+v", kernels)
	}
	s.pm.Stop(t, id)
	waitAllDead(t, kernels, 5*time.Second)
}

// snapshotHolds reports whether the ledger has a "supervise" snapshot of
// tr's group naming every member of tr.
func snapshotHolds(store *ledger.Store, id string, tr trees.Tree) bool {
	rec, err := store.Load(id)
	if err != nil {
		return false
	}
	for _, lt := range rec.Trees {
		if lt.Source != supervise.SnapshotSource || lt.PGID != tr.PGID {
			continue
		}
		all := true
		for _, m := range tr.Members {
			all = all && slices.ContainsFunc(lt.Members, func(p ledger.Process) bool {
				return p.PID == m.PID && p.StartTicks == m.StartTicks
			})
		}
		return all
	}
	return false
}

// TestSupervisorRefused: an annotation naming anything but an allowlist
// entry is refused and logged; the container starts anyway.
func TestSupervisorRefused(t *testing.T) {
	s := newSuperviseEnv(t)
	id := s.run(t, "/bin/sh -c 'touch /tmp/pwned'")
	id2 := s.run(t, "unknown")
	for _, c := range []string{id, id2} {
		if st := s.pm.State(t, c); st != "running" {
			t.Errorf("container %.12s is %s", c, st)
		}
		if ts := wrapperTrees(t, c); len(ts) != 0 {
			t.Errorf("container %.12s got a supervisor: %+v", c, ts)
		}
	}
	log, _ := os.ReadFile(filepath.Join(s.state, "kc-hook.log"))
	if n := strings.Count(string(log), "supervisor refused: not in the allowlist"); n != 2 {
		t.Errorf("%d refusals logged, want 2:\n%s", n, log)
	}
	store, _ := ledger.OpenReadOnly(s.state)
	if rec, err := store.Load(id); err != nil || rec.Init == nil || rec.Supervisor != nil {
		t.Errorf("record = %+v, %v; want init recorded, no supervisor", rec, err)
	}
}

// TestSupervisorRestart: podman restart three times → exactly one tree at
// the end, watching the current init. Also without the poststop hook,
// where only the wrappers' own init watch and the launch's one-per-
// container rule keep trees from piling up.
func TestSupervisorRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stages []string
	}{
		{"with poststop", nil},
		{"createRuntime only", []string{"createruntime"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuperviseEnv(t, tc.stages...)
			id := s.run(t, "fake")
			first := waitTree(t, id)
			for i := 0; i < 3; i++ {
				if _, err := s.pm.Podman("restart", "-t", "0", id); err != nil {
					t.Fatal(err)
				}
			}
			tr := waitTree(t, id)
			waitAllDead(t, first.Stats(), 5*time.Second)
			spec, err := supervise.ParseArgv(member(tr, trees.WrapperComm).Argv)
			if init := s.pm.InitPID(t, id); err != nil || spec.Init.PID != init {
				t.Fatalf("the tree watches init %d (err %v), the container's is %d", spec.Init.PID, err, init)
			}
			// Stays one: nothing is still on its way out or in.
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				if ts := wrapperTrees(t, id); len(ts) != 1 {
					t.Fatalf("%d wrapper trees: %+v", len(ts), ts)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if st := s.pm.State(t, id); st != "running" {
				t.Errorf("container is %s", st)
			}
		})
	}
}

// exampleAllowlist is docs/supervisors.example.json with its "kallichore"
// entry renamed "fake", the fake kcserver as argv[0] and every flag as
// shipped but the value of --socket-dir: the example's /tmp becomes
// sockDir, so no test leaves kc-<pid>.sock files in the host's /tmp. Only
// the environment gains the fake's two kernels.
func exampleAllowlist(t *testing.T, sockDir string) map[string]any {
	t.Helper()
	data, err := os.ReadFile("../../docs/supervisors.example.json")
	if err != nil {
		t.Fatal(err)
	}
	var al struct {
		Supervisors map[string]struct {
			Argv []string `json:"argv"`
			Env  []string `json:"env"`
		} `json:"supervisors"`
	}
	if err := json.Unmarshal(data, &al); err != nil {
		t.Fatal(err)
	}
	e, ok := al.Supervisors["kallichore"]
	if !ok || len(e.Argv) == 0 || filepath.Base(e.Argv[0]) != "kcserver" {
		t.Fatalf("the example has no kcserver entry named kallichore: %s", data)
	}
	argv := append([]string{testutil.BuildKCServer(t)}, e.Argv[1:]...)
	i := slices.Index(argv, "--socket-dir")
	if i < 0 || i+1 >= len(argv) || argv[i+1] != "/tmp" {
		t.Fatalf("the example's kallichore entry does not say --socket-dir /tmp: %q", e.Argv)
	}
	argv[i+1] = sockDir
	return map[string]any{"supervisors": map[string]any{"fake": map[string]any{
		"argv": argv,
		"env":  append(e.Env, "KCFAKE_CHILDREN=2"),
	}}}
}
