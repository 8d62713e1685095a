package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

type doctorCheck struct {
	Name    string   `json:"name"`
	Verdict string   `json:"verdict"`
	Detail  string   `json:"detail"`
	Items   []string `json:"items"`
}

type doctorReport struct {
	Checks []doctorCheck `json:"checks"`
	Worst  string        `json:"worst"`
	Fix    bool          `json:"fix"`
}

func (r doctorReport) check(t *testing.T, name string) doctorCheck {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r)
	return doctorCheck{}
}

// TestDoctorRealPodman: a host with the hook installed in podman's hooks
// dir, a running container, and a container stopped while the hook was
// not installed, whose supervisor tree (holding an abandoned session) is
// still there. doctor reports the stray and the session and exits 1;
// doctor --fix reaps the stray as reconcile --apply would, spares the
// running container's tree, and exits 0. A descriptor whose binary is
// missing is then silently dropped by podman — and doctor says so (exit 2).
func TestDoctorRealPodman(t *testing.T) {
	e := podmantest.New(t)
	url := e.StartAPI(t)
	state := t.TempDir()

	installHook(t, e, state)
	running := e.Run(t) // the hook records it at createRuntime
	removeHook(t, e)
	stopped := e.Run(t)
	installHook(t, e, state)

	// A supervisor name of this test's own, and its own socket dir:
	// --fix must not touch other packages' fake trees.
	const comm = "kcsrv-e2e-doc"
	sessions := filepath.Join(t.TempDir(), "sessions.json")
	if err := os.WriteFile(sessions, []byte(`[{"session_id":"py-abandoned","language":"python","status":"idle",
		"connected":false,"idle_seconds":200000,"working_directory":"/home/a","resource_usage":{"memory_bytes":4096}}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	noSessions := filepath.Join(t.TempDir(), "none.json")
	if err := os.WriteFile(noSessions, []byte("[]"), 0o644); err != nil {
		t.Fatal(err)
	}
	sockDir := t.TempDir()
	_, strayTree := startTree(t, sockDir, stopped, testutil.Fake{Comm: comm, Sessions: sessions})
	_, liveTree := startTree(t, sockDir, running, testutil.Fake{Comm: comm, Sessions: noSessions})
	stopContainer(t, e, stopped)

	env := e.Environ()
	base := []string{"doctor", "--format", "json", "--podman-url", url, "--state-dir", state, "--hooks-dir", e.HooksDir(),
		"--supervisor-comm", comm, "--socket-dir", sockDir, "--min-age", "0s", "--kill-grace", "500ms",
		"--container", stopped, "--container", running}
	for _, a := range e.GlobalArgs() {
		base = append(base, "--podman-arg="+a)
	}
	run := func(t *testing.T, args ...string) (doctorReport, int) {
		t.Helper()
		out, errOut, code := janitor(t, env, append(base, args...)...)
		var rep doctorReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("doctor printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
		}
		return rep, code
	}

	t.Run("audit: the stray and the abandoned session are warnings", func(t *testing.T) {
		rep, code := run(t)
		if code != 1 || rep.Worst != "warn" {
			t.Fatalf("exit %d, worst %s, want 1/warn: %+v", code, rep.Worst, rep)
		}
		for name, want := range map[string]string{
			"hook-installed": "ok", "hook-alive": "ok", "podman": "ok", "state-dir": "ok",
			"stray-trees": "warn", "orphan-sockets": "ok", "abandoned-sessions": "warn",
		} {
			if c := rep.check(t, name); c.Verdict != want {
				t.Errorf("%s: %s, want %s: %s %v", name, c.Verdict, want, c.Detail, c.Items)
			}
		}
		if c := rep.check(t, "podman"); !strings.HasPrefix(c.Detail, "api ") {
			t.Errorf("podman asked through %s", c.Detail)
		}
		strays := rep.check(t, "stray-trees")
		if len(strays.Items) != 1 || !strings.Contains(strays.Items[0], stopped[:12]) || !strings.Contains(strays.Items[0], "would-reap") {
			t.Errorf("stray items %q", strays.Items)
		}
		if c := rep.check(t, "abandoned-sessions"); len(c.Items) != 1 || !strings.Contains(c.Items[0], "py-abandoned") {
			t.Errorf("sessions %+v", c)
		}
		if n := len(aliveOf(strayTree)); n != len(strayTree) {
			t.Errorf("doctor without --fix killed %d processes", len(strayTree)-n)
		}
	})

	t.Run("status shows both trees with their containers", func(t *testing.T) {
		out, _, code := janitor(t, env, "status", "--format", "json", "--podman-url", url, "--state-dir", state,
			"--supervisor-comm", comm, "--socket-dir", sockDir, "--min-age", "0s", "--container", stopped, "--container", running)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out)
		}
		var st struct {
			Records []struct {
				ContainerID    string `json:"container_id"`
				ContainerState string `json:"container_state"`
			} `json:"records"`
			Trees []struct {
				ContainerID    string `json:"container_id"`
				ContainerState string `json:"container_state"`
				PGID           int    `json:"pgid"`
				Decision       string `json:"decision"`
			} `json:"trees"`
			Sockets []struct {
				Verdict string `json:"verdict"`
			} `json:"sockets"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		want := map[int]string{strayTree[0].PGID: stopped + " exited would-reap", liveTree[0].PGID: running + " running skipped-live"}
		for _, tr := range st.Trees {
			if w, ok := want[tr.PGID]; ok {
				if got := tr.ContainerID + " " + tr.ContainerState + " " + tr.Decision; got != w {
					t.Errorf("tree %d: %s, want %s", tr.PGID, got, w)
				}
				delete(want, tr.PGID)
			}
		}
		if len(want) > 0 {
			t.Errorf("trees missing from status: %v\n%s", want, out)
		}
		if len(st.Records) != 1 || st.Records[0].ContainerID != running || st.Records[0].ContainerState != "running" {
			t.Errorf("records %+v", st.Records)
		}
		if len(st.Sockets) != 2 {
			t.Errorf("sockets %+v", st.Sockets)
		}
	})

	t.Run("fix reaps the stray and only it", func(t *testing.T) {
		metricsFile := filepath.Join(t.TempDir(), "kc.prom")
		rep, code := run(t, "--fix", "--metrics-file", metricsFile)
		strays := rep.check(t, "stray-trees")
		if strays.Verdict != "ok" || !strings.Contains(strays.Detail, "fixed: reaped 1 stray tree") {
			t.Errorf("strays after --fix: %+v", strays)
		}
		waitAllDead(t, strayTree, 0)
		if n := len(aliveOf(liveTree)); n != len(liveTree) {
			t.Errorf("--fix killed %d members of a running container's tree", len(liveTree)-n)
		}
		// The reaped tree's socket went with it, and so did its session.
		if code != 0 || rep.Worst != "ok" {
			t.Errorf("exit %d, worst %s, want 0/ok: %+v", code, rep.Worst, rep)
		}
		data, err := os.ReadFile(metricsFile)
		if err != nil || !strings.Contains(string(data), "kc_janitor_strays_reaped 1\n") ||
			!strings.Contains(string(data), `kc_janitor_doctor_check{check="stray-trees"} 0`) {
			t.Errorf("metrics (%v):\n%s", err, data)
		}
	})

	t.Run("a descriptor whose binary is missing: podman drops it silently, doctor does not", func(t *testing.T) {
		for _, d := range []string{"kc-hook-createruntime.json", "kc-hook-poststop.json"} {
			p := filepath.Join(e.HooksDir(), d)
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var desc map[string]any
			json.Unmarshal(data, &desc)
			desc["hook"].(map[string]any)["path"] = "/nonexistent/libexec/kc-hook"
			data, _ = json.Marshal(desc)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		id := e.Run(t) // podman starts it without a word
		if _, err := os.Stat(filepath.Join(state, "containers", id+".json")); err == nil {
			t.Error("the hook ran although its binary is missing")
		}
		rep, code := run(t)
		c := rep.check(t, "hook-installed")
		if code != 2 || c.Verdict != "error" || !strings.Contains(strings.Join(c.Items, "\n"), "podman silently drops this descriptor") {
			t.Errorf("exit %d: %+v", code, c)
		}
	})
}
