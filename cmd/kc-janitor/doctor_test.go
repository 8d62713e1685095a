package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
)

// doctorHost is a host as doctor sees it: a hooks dir with the
// repository's descriptors pointing at an executable stand-in for kc-hook,
// a state dir with a ledger, an empty socket dir, and no podman at all.
type doctorHost struct {
	hooks, state, socks, hook string
}

func newDoctorHost(t *testing.T) doctorHost {
	t.Helper()
	base := t.TempDir()
	h := doctorHost{hooks: filepath.Join(base, "hooks.d"), state: filepath.Join(base, "state"),
		socks: filepath.Join(base, "sock"), hook: filepath.Join(base, "libexec", "kc-hook")}
	for _, d := range []string{h.hooks, h.socks, filepath.Dir(h.hook)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(h.hook, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../../hooks.d/*.json")
	if len(files) == 0 {
		t.Fatal("no descriptors in hooks.d")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(strings.ReplaceAll(string(data), "/usr/local/libexec/oci/hooks.d/kc-hook", h.hook))
		// The hook must write where this janitor reads (--state-dir).
		data = []byte(strings.Replace(string(data), `"env": [`, `"env": ["KC_STATE_DIR=`+h.state+`", `, 1))
		if err := os.WriteFile(filepath.Join(h.hooks, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ledger.Open(h.state); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir()) // no podman CLI to fall back to
	return h
}

func (h doctorHost) args(extra ...string) []string {
	return append([]string{"doctor", "--hooks-dir", h.hooks, "--state-dir", h.state, "--socket-dir", h.socks,
		"--podman-url", "unix:///nonexistent/podman.sock", "--podman-timeout", "2s"}, extra...)
}

func decodeDoctor(t *testing.T, out string) doctor.Report {
	t.Helper()
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	return rep
}

func checkOf(t *testing.T, rep doctor.Report, name string) doctor.Check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in %+v", name, rep)
	return doctor.Check{}
}

// TestDoctorPodmanUnreachable: every check runs; podman unreachable is a
// warning that says the strays could not be looked for — never a silent
// ok — and the exit code is 1.
func TestDoctorPodmanUnreachable(t *testing.T) {
	h := newDoctorHost(t)
	code, out := runJanitorCapture(t, h.args("--format", "json")...)
	rep := decodeDoctor(t, out)
	if code != 1 || rep.Worst != doctor.Warn {
		t.Fatalf("exit %d, worst %v, want 1/warn:\n%s", code, rep.Worst, out)
	}
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != strings.Join(doctor.Names, ",") {
		t.Errorf("checks %v, want %v", names, doctor.Names)
	}
	if c := checkOf(t, rep, doctor.NameHookInstalled); c.Verdict != doctor.OK {
		t.Errorf("hook installed: %+v", c)
	}
	if c := checkOf(t, rep, doctor.NamePodman); c.Verdict != doctor.Warn || !strings.Contains(c.Detail, "unreachable") {
		t.Errorf("podman: %+v", c)
	}
	if c := checkOf(t, rep, doctor.NameStrays); c.Verdict != doctor.Warn || !strings.Contains(c.Detail, "not checked") {
		t.Errorf("strays: %+v", c)
	}
	if c := checkOf(t, rep, doctor.NameHookAlive); c.Verdict != doctor.Warn || !strings.Contains(c.Detail, "cannot tell") {
		t.Errorf("hook alive: %+v", c)
	}
	if c := checkOf(t, rep, doctor.NameStateDir); c.Verdict != doctor.OK {
		t.Errorf("state dir: %+v", c)
	}
	if c := checkOf(t, rep, doctor.NamePidfds); c.Verdict != doctor.Warn || !strings.Contains(c.Detail, "cannot tell") {
		t.Errorf("death pidfds: %+v; want no count passed off as one", c)
	}
}

var doctorLine = regexp.MustCompile(`^[a-z ]+ \.{3,} (ok|WARN|ERROR)( \(.+\))?$`)

func TestDoctorText(t *testing.T) {
	h := newDoctorHost(t)
	code, out := runJanitorCapture(t, h.args()...)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(line, "    ") {
			continue // an item under a check
		}
		n++
		if !doctorLine.MatchString(line) {
			t.Errorf("line %q is not `label .... verdict (detail)`", line)
		}
	}
	if n != len(doctor.Names) {
		t.Errorf("%d check lines, want %d:\n%s", n, len(doctor.Names), out)
	}
	if !strings.Contains(out, "podman ground truth ........... WARN (unreachable") {
		t.Errorf("output:\n%s", out)
	}
}

// TestDoctorBrokenHook: a descriptor whose binary is missing (podman drops
// it silently) or that is not JSON is an error, exit 2.
func TestDoctorBrokenHook(t *testing.T) {
	for _, c := range []struct {
		name   string
		break_ func(h doctorHost)
		text   string
	}{
		{"binary missing", func(h doctorHost) { os.Remove(h.hook) }, "podman silently drops this descriptor"},
		{"malformed descriptor", func(h doctorHost) {
			os.WriteFile(filepath.Join(h.hooks, "kc-hook-poststop.json"), []byte(`{"version": "1.0.0", "hook": {`), 0o644)
		}, "malformed JSON"},
		{"no descriptor", func(h doctorHost) {
			files, _ := filepath.Glob(filepath.Join(h.hooks, "*.json"))
			for _, f := range files {
				os.Remove(f)
			}
		}, "no kc-hook descriptor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newDoctorHost(t)
			c.break_(h)
			code, out := runJanitorCapture(t, h.args("--format", "json")...)
			rep := decodeDoctor(t, out)
			ch := checkOf(t, rep, doctor.NameHookInstalled)
			all := ch.Text() + "\n" + strings.Join(ch.Items, "\n")
			if code != 2 || ch.Verdict != doctor.Error || !strings.Contains(all, c.text) {
				t.Errorf("exit %d, check %+v; want exit 2, error with %q", code, ch, c.text)
			}
		})
	}
}

// TestDoctorMetrics: --metrics-file records every check's verdict and the
// run, readable by the Prometheus text parser.
func TestDoctorMetrics(t *testing.T) {
	h := newDoctorHost(t)
	mf := filepath.Join(t.TempDir(), "kc.prom")
	// A check an earlier run made and this one does not (an engine no
	// longer asked) goes from the file.
	stale := "# TYPE kc_janitor_doctor_check gauge\nkc_janitor_doctor_check{check=\"no-longer-made\"} 2\n" +
		// An apply run's gauge in the shared file: a look leaves it.
		"# TYPE kc_janitor_strays_failed gauge\nkc_janitor_strays_failed 1\n"
	if err := os.WriteFile(mf, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _ := runJanitorCapture(t, h.args("--metrics-file", mf)...)
	if code != 1 {
		t.Errorf("exit %d", code)
	}
	fams := readMetrics(t, mf)
	if v, ok := gauge(fams, metrics.DoctorCheck, "check", "no-longer-made"); ok {
		t.Errorf("an earlier run's check is still in the file: %v", v)
	}
	if v, ok := gauge(fams, metrics.StraysFailed); !ok || v != 1 {
		t.Errorf("a look changed an apply run's strays_failed: %v %v, want 1", v, ok)
	}
	for name, want := range map[string]float64{
		doctor.NameHookInstalled: 0, doctor.NamePodman: 1, doctor.NameStrays: 1, doctor.NameStateDir: 0,
	} {
		if v, ok := gauge(fams, metrics.DoctorCheck, "check", name); !ok || v != want {
			t.Errorf("doctor check %s = %v (%v), want %v", name, v, ok, want)
		}
	}
	if v, ok := gauge(fams, metrics.GroundTruthKnown, "command", "doctor"); !ok || v != 0 {
		t.Errorf("ground truth known %v %v", v, ok)
	}
	if v, ok := gauge(fams, metrics.RunSuccess, "command", "doctor"); !ok || v != 0 {
		t.Errorf("doctor success %v %v", v, ok)
	}
}

// TestDoctorAcceptsDemoFlags: the flags scripts/demo.sh passes.
func TestDoctorAcceptsDemoFlags(t *testing.T) {
	h := newDoctorHost(t)
	code, out := runJanitorCapture(t, "doctor", "--podman-url", "unix:///nonexistent/podman.sock", "--state-dir", h.state,
		"--podman-arg=--root=/nonexistent/storage", "--podman-arg=--runroot=/nonexistent/run", "--podman-arg=--storage-driver=vfs",
		"--hooks-dir", h.hooks, "--min-age", "0s", "--format", "json", "--socket-dir", h.socks)
	if code == exitUsage {
		t.Fatalf("usage error: %s", out)
	}
	decodeDoctor(t, out)
}

func TestDoctorUsage(t *testing.T) {
	for _, args := range [][]string{
		{"doctor", "--idle", "soon"},
		{"doctor", "--min-age", "-1s"},
		{"doctor", "--timeout", "0s"},
		{"doctor", "--fix=maybe"},
	} {
		if code, out := runJanitorCapture(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want 2: %s", args, code, out)
		}
	}
}

// TestDoctorJSONKeys: every check of doctor's JSON carries "check",
// "verdict", "message" and "remedy", and, for one release, the keys it
// had before: "name" (the check) and "detail" (message and remedy).
func TestDoctorJSONKeys(t *testing.T) {
	h := newDoctorHost(t)
	_, out := runJanitorCapture(t, h.args("--format", "json")...)
	var raw struct {
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw.Checks) == 0 {
		t.Fatalf("%v:\n%s", err, out)
	}
	remedies := 0
	for _, c := range raw.Checks {
		t.Run(fmt.Sprint(c["check"]), func(t *testing.T) {
			for _, key := range []string{"check", "verdict", "message", "remedy", "name", "detail", "label"} {
				if _, ok := c[key].(string); !ok {
					t.Errorf("no string %q: %v", key, c)
				}
			}
			if c["name"] != c["check"] {
				t.Errorf("name %v, check %v", c["name"], c["check"])
			}
			want := c["message"]
			if r := c["remedy"]; r != "" {
				remedies++
				want = fmt.Sprintf("%s; remedy: %s", c["message"], r)
				if c["verdict"] == "ok" {
					t.Errorf("a remedy for an ok check: %v", c)
				}
			}
			if c["detail"] != want {
				t.Errorf("detail %q, want %q", c["detail"], want)
			}
		})
	}
	// podman is unreachable here: its check and the strays check say
	// what to do.
	if remedies < 2 {
		t.Errorf("%d remedies:\n%s", remedies, out)
	}
}

// TestDoctorNamedEngineOnly: doctor --engine docker (or
// containerd) on a host without hooks has no line about podman: no
// podman check, and the hook checks word their verdicts without it.
func TestDoctorNamedEngineOnly(t *testing.T) {
	for _, tc := range []struct{ engine, endpoint string }{
		{"docker", "--docker-url=unix:///nonexistent/docker.sock"},
		{"containerd", "--containerd-address=/nonexistent/containerd.sock"},
		{"docker,containerd", "--docker-url=unix:///nonexistent/docker.sock"},
	} {
		// (The test's temporary paths must not say podman either.)
		t.Run(strings.ReplaceAll(tc.engine, ",", "+"), func(t *testing.T) {
			h := newDoctorHost(t)
			files, _ := filepath.Glob(filepath.Join(h.hooks, "*.json"))
			for _, f := range files {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
			_, out := runJanitorCapture(t, h.args("--engine", tc.engine, tc.endpoint, "--containerd-address=/nonexistent/containerd.sock")...)
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(strings.ToLower(l), "podman") {
					t.Errorf("talks about podman: %q", l)
				}
			}
			if !strings.Contains(out, "hook installed") || !strings.Contains(out, "hook alive") {
				t.Errorf("no hook checks:\n%s", out)
			}
		})
	}
}

// TestDoctorFixStateDirRefused: a --fix whose state dir cannot be locked
// (a symlink) reaps nothing and says why, as a state-dir problem: not as
// a failure to scan the processes.
func TestDoctorFixStateDirRefused(t *testing.T) {
	h := newDoctorHost(t)
	noContainersPodman(t)
	link := filepath.Join(t.TempDir(), "state-link")
	if err := os.Symlink(h.state, link); err != nil {
		t.Fatal(err)
	}
	// Scoped to a comm no process has: were the refusal to regress, this
	// --fix must reap nothing of the host's.
	args := append(h.args("--fix", "--format", "json", "--engine", "podman", "--podman-arg=--root="+t.TempDir(), "--supervisor-comm", "kcsrv-fixrefuse"), "--state-dir", link)
	_, out := runJanitorCapture(t, args...)
	rep := decodeDoctor(t, out)
	ch := checkOf(t, rep, doctor.NameStrays)
	if ch.Verdict != doctor.Error || strings.Contains(ch.Detail, "cannot scan processes") || !strings.Contains(ch.Remedy, "state dir") {
		t.Errorf("stray-trees check %+v; want an error naming the state dir, not the scan", ch)
	}
}
