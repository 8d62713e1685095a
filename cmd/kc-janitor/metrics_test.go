package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
)

// readMetrics parses a metrics file with the Prometheus text parser.
func readMetrics(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(f)
	if err != nil {
		data, _ := os.ReadFile(path)
		t.Fatalf("Prometheus text parser: %v\n%s", err, data)
	}
	return fams
}

// gauge returns the value of a gauge series with exactly the given label
// pairs ("k", "v", ...).
func gauge(fams map[string]*dto.MetricFamily, name string, kv ...string) (float64, bool) {
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_GAUGE {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		want[kv[i]] = kv[i+1]
	}
outer:
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if want[l.GetName()] != l.GetValue() {
				continue outer
			}
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// TestMetricsFileSharedByCommands: reconcile (podman unreachable), sweep
// (one orphan socket, dry run then apply) and cull write one file; each
// keeps the others' series, and the values are what the runs found.
func TestMetricsFileSharedByCommands(t *testing.T) {
	mf := filepath.Join(t.TempDir(), "kc-janitor.prom")
	socks := t.TempDir()
	orphanSock(t, socks, goneSockName(t))
	t.Setenv("PATH", t.TempDir()) // no podman CLI either

	code, _ := runJanitorCapture(t, "reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--metrics-file", mf)
	if code != exitUnknown {
		t.Fatalf("reconcile exit %d", code)
	}
	code, _ = runJanitorCapture(t, "--metrics-file", mf, "sweep", "--socket-dir", socks) // global flag before the command
	if code != exitOK {
		t.Fatalf("sweep exit %d", code)
	}
	fams := readMetrics(t, mf)
	for _, c := range []struct {
		name string
		kv   []string
		want float64
	}{
		{metrics.GroundTruthKnown, []string{"command", "reconcile"}, 0},
		{metrics.RunSuccess, []string{"command", "reconcile"}, 0},
		{metrics.RunSuccess, []string{"command", "sweep"}, 1},
		{metrics.SocketsStale, nil, 1},
		{metrics.SocketsUnlinked, nil, 0},
		{metrics.Sockets, []string{"verdict", "stale"}, 1},
		{metrics.Sockets, []string{"verdict", "live"}, 0},
	} {
		if v, ok := gauge(fams, c.name, c.kv...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.kv, v, ok, c.want)
		}
	}
	for _, cmd := range []string{"reconcile", "sweep"} {
		if v, ok := gauge(fams, metrics.LastRun, "command", cmd); !ok || v < 1e9 {
			t.Errorf("last run of %s: %v %v", cmd, v, ok)
		}
		if _, ok := gauge(fams, metrics.RunDuration, "command", cmd); !ok {
			t.Errorf("no duration for %s", cmd)
		}
	}

	code, _ = runJanitorCapture(t, "sweep", "--socket-dir", socks, "--apply", "--metrics-file", mf)
	if code != exitOK {
		t.Fatalf("sweep --apply exit %d", code)
	}
	code, _ = runJanitorCapture(t, "cull", "--socket-dir", socks, "--metrics-file", mf)
	if code != exitOK {
		t.Fatalf("cull exit %d", code)
	}
	fams = readMetrics(t, mf)
	if v, _ := gauge(fams, metrics.SocketsUnlinked); v != 1 {
		t.Errorf("sockets unlinked %v, want 1", v)
	}
	if v, ok := gauge(fams, metrics.SessionsAbandoned); !ok || v != 0 {
		t.Errorf("sessions abandoned %v %v", v, ok)
	}
	if v, ok := gauge(fams, metrics.RunSuccess, "command", "reconcile"); !ok || v != 0 {
		t.Errorf("reconcile's series lost by later commands: %v %v", v, ok)
	}
	info, err := os.Stat(mf)
	if err != nil || info.Mode().Perm() != 0o644 {
		t.Errorf("metrics file mode: %v %v", info, err)
	}
}

// TestMetricsFileUnwritable: a run that cannot write its metrics fails
// (exit 1, saying why); a run that failed anyway keeps its own code. A
// metrics file in a directory that does not exist is a usage error before
// anything runs, and no directory is created.
func TestMetricsFileUnwritable(t *testing.T) {
	socks := t.TempDir()
	missing := filepath.Join(t.TempDir(), "missing", "kc.prom")
	for _, args := range [][]string{
		{"sweep", "--socket-dir", socks, "--metrics-file", missing},
		{"watch", "--once", "--no-reconcile", "--socket-dir", socks, "--metrics-file", missing},
	} {
		if code, _, stderr := runJanitor(t, nil, args...); code != exitUsage || !strings.Contains(stderr, "does not exist") {
			t.Errorf("%s in a missing dir: exit %d, stderr %q; want 2", args[0], code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Dir(missing)); err == nil {
		t.Error("the metrics file's directory was created")
	}
	// A directory where the file should be: the atomic replace fails.
	bad := filepath.Join(t.TempDir(), "kc.prom")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runJanitor(t, nil, "sweep", "--socket-dir", socks, "--metrics-file", bad)
	if code != exitFailed || !strings.Contains(stderr, "metrics:") {
		t.Errorf("sweep: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runJanitor(t, []string{"PATH=" + t.TempDir()}, "reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--metrics-file", bad)
	if code != exitUnknown || !strings.Contains(stderr, "metrics:") {
		t.Errorf("reconcile without podman: exit %d, stderr %q", code, stderr)
	}
	code, _, _ = runJanitor(t, nil, "watch", "--once", "--no-reconcile", "--socket-dir", socks, "--metrics-file", bad)
	if code != exitFailed {
		t.Errorf("watch --once: exit %d, want 1", code)
	}
}

// TestMetricsAfterUnknownGroundTruth: a reconcile that could not ask the
// engines says so per command and takes out the stray counts an earlier
// run wrote, instead of leaving them to be read as current.
func TestMetricsAfterUnknownGroundTruth(t *testing.T) {
	mf := filepath.Join(t.TempDir(), "kc-janitor.prom")
	old := "# HELP kc_janitor_strays_found old\n# TYPE kc_janitor_strays_found gauge\nkc_janitor_strays_found 4\n" +
		"# HELP kc_janitor_ground_truth_known old\n# TYPE kc_janitor_ground_truth_known gauge\nkc_janitor_ground_truth_known 1\n" +
		"# HELP kc_janitor_trees old\n# TYPE kc_janitor_trees gauge\nkc_janitor_trees{action=\"would-reap\"} 4\n"
	if err := os.WriteFile(mf, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	if code, _ := runJanitorCapture(t, "reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--metrics-file", mf); code != exitUnknown {
		t.Fatalf("reconcile exit %d", code)
	}
	fams := readMetrics(t, mf)
	for _, gone := range []string{metrics.StraysFound, metrics.Trees} {
		if _, ok := fams[gone]; ok {
			t.Errorf("%s from an earlier run kept after a run that could not know", gone)
		}
	}
	if v, ok := gauge(fams, metrics.GroundTruthKnown, "command", "reconcile"); !ok || v != 0 {
		t.Errorf("ground truth known{command=reconcile} %v %v", v, ok)
	}
	if v, ok := gauge(fams, metrics.RunSuccess, "command", "reconcile"); !ok || v != 0 {
		t.Errorf("run success{command=reconcile} %v %v", v, ok)
	}
	if len(fams[metrics.GroundTruthKnown].Metric) != 1 {
		t.Errorf("the old unlabelled series is mixed with the new: %v", fams[metrics.GroundTruthKnown])
	}
}

func TestManAndCompletion(t *testing.T) {
	code, out := runJanitorCapture(t, "man")
	if code != exitOK || !strings.Contains(out, `.TH KC\-JANITOR 8`) {
		t.Fatalf("exit %d:\n%.300s", code, out)
	}
	for _, want := range []string{".SS doctor", ".SS reconcile", `\fB\-\-metrics\-file FILE\fR`, `kc\-*.sock`, "/proc/<init pid>/root", "KC_*"} {
		if !strings.Contains(out, want) {
			t.Errorf("man page lacks %q", want)
		}
	}
	if strings.Contains(out, `\fI`) {
		t.Error("man page has stray italics: a '*' or '_' was taken for emphasis")
	}
	for _, sh := range []string{"bash", "zsh"} {
		code, out := runJanitorCapture(t, "completion", sh)
		if code != exitOK || !strings.Contains(out, "kc-janitor") || !strings.Contains(out, cliapp.CompleteArg) {
			t.Errorf("%s: exit %d:\n%s", sh, code, out)
		}
		if path, err := exec.LookPath(sh); err == nil {
			f := filepath.Join(t.TempDir(), "c")
			os.WriteFile(f, []byte(out), 0o644)
			if b, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v: %s", sh, err, b)
			}
		}
	}
	if code, _ := runJanitorCapture(t, "completion", "fish"); code != exitUsage {
		t.Errorf("completion fish: exit %d, want 2", code)
	}
}
