// Package e2e runs kc-hook and kc-janitor, built as the user builds them,
// against real podman containers, real processes and real sockets.
package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// bin builds (once per test binary) and returns the path of kc-hook or
// kc-janitor, built as the Makefile builds them.
func bin(t testing.TB, name string) string {
	t.Helper()
	return testutil.Build(t, "github.com/kc-watchman/kc-watchman/cmd/"+name, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuilds()
	testutil.RemoveContainParents()
	os.Exit(code)
}

// installHook installs the repository's hooks.d descriptors into the Env's
// hooks dir, rewritten as `make install` does, with env pointing the hook
// at stateDir.
func installHook(t *testing.T, e *podmantest.Env, stateDir string, extraEnv ...string) {
	t.Helper()
	hook := bin(t, "kc-hook")
	descs, err := filepath.Glob("../../hooks.d/*.json")
	if err != nil || len(descs) == 0 {
		t.Fatalf("no descriptors in hooks.d: %v", err)
	}
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
		if h["path"] != "/usr/local/libexec/oci/hooks.d/kc-hook" {
			t.Fatalf("%s: path %v is not the documented install path", d, h["path"])
		}
		h["path"] = hook
		env := []any{"KC_STATE_DIR=" + stateDir, "KC_KILL_GRACE=1s"}
		for _, kv := range extraEnv {
			env = append(env, kv)
		}
		h["env"] = append(env, h["env"].([]any)...)
		out, _ := json.Marshal(desc)
		if err := os.WriteFile(filepath.Join(e.HooksDir(), filepath.Base(d)), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// removeHook removes the installed descriptors: containers created after
// this get no hook.
func removeHook(t *testing.T, e *podmantest.Env) {
	t.Helper()
	descs, _ := filepath.Glob(filepath.Join(e.HooksDir(), "kc-hook-*.json"))
	for _, d := range descs {
		if err := os.Remove(d); err != nil {
			t.Fatal(err)
		}
	}
}

// group lists the live members of process group pgid.
func group(t testing.TB, pgid int) []fingerprint.Stat {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []fingerprint.Stat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat("/proc", pid)
		if err != nil || st.PGID != pgid || st.Zombie() {
			continue
		}
		out = append(out, st)
	}
	return out
}

// aliveOf returns the members of ms that are still the same, living
// processes.
func aliveOf(ms []fingerprint.Stat) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range ms {
		if fingerprint.Alive("/proc", m) {
			out = append(out, m)
		}
	}
	return out
}

// waitAllDead polls until none of ms is alive.
func waitAllDead(t testing.TB, ms []fingerprint.Stat, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(aliveOf(ms)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still alive after %v: %+v", within, aliveOf(ms))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startTree starts a fake kcserver tree for container id the way kc-hook
// would: a `kc-hook supervise` wrapper carrying the ID (watching a
// stand-in init, not the container's), the supervisor, two sleeping
// kernels and one that ignores SIGTERM, plus f's other settings. It
// returns the server and the group's members once all are there.
func startTree(t testing.TB, sockDir, id string, f testutil.Fake) (*testutil.KCServer, []fingerprint.Stat) {
	t.Helper()
	f.ContainerID, f.Children, f.Stubborn = id, 2, true
	k := testutil.StartKCServer(t, sockDir, f)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms := group(t, k.PGID)
		if len(ms) >= 5 {
			t.Cleanup(func() { killGroup(ms) })
			return k, ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree of %d has %d members, want 5", k.PGID, len(ms))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killGroup SIGKILLs whichever recorded members are still the recorded
// processes (cleanup; never by PID alone).
func killGroup(ms []fingerprint.Stat) {
	for _, m := range aliveOf(ms) {
		if p, err := fingerprint.Pin("/proc", m); err == nil {
			p.Signal(9)
			p.Close()
		}
	}
}

// janitor runs kc-janitor with args and env and returns stdout, stderr and
// the exit code.
func janitor(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin(t, "kc-janitor"), args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("kc-janitor %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}
