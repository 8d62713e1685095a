package kubernetes

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// TestJanitorRunsWithManifestArgs runs kc-janitor with exactly the
// DaemonSet's args and env, against the private containerd mounted where
// the manifest expects containerd's socket: in a mount namespace of its
// own, /run and /var/lib are fresh tmpfs, /run/containerd is the private
// containerd's directory and the textfile directory is this test's. The
// janitor must get through a whole round (its metrics file appears) with
// no usage error, and stop cleanly on SIGTERM (exit 143).
func TestJanitorRunsWithManifestArgs(t *testing.T) {
	addr := containerdtest.Address(t)
	if filepath.Base(addr) != "containerd.sock" {
		t.Fatalf("%s: the private containerd's socket must be named containerd.sock", addr)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	_, c := janitor(t)
	bin := testutil.Build(t, testutil.KCJanitorPackage, "kc-janitor")
	textfile := t.TempDir()

	var metrics string
	for i, a := range c.Args {
		if a == "--metrics-file" && i+1 < len(c.Args) {
			metrics = c.Args[i+1]
		}
	}
	if filepath.Dir(metrics) != "/var/lib/node-exporter" {
		t.Fatalf("metrics file %q is not in /var/lib/node-exporter", metrics)
	}
	script := `set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /run
mkdir -p /run/containerd /run/kc-watchman
mount --bind "$CTRD_DIR" /run/containerd
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/node-exporter
mount --bind "$TEXTFILE" /var/lib/node-exporter
exec "$@"`
	cmd := exec.Command("unshare", append([]string{"-m", "sh", "-c", script, "sh", bin}, c.Args...)...)
	env := []string{"PATH=" + os.Getenv("PATH"), "CTRD_DIR=" + filepath.Dir(addr), "TEXTFILE=" + textfile}
	// The manifest's port on the loopback would collide with another run
	// on this machine: the address is the kernel's choice here.
	env = append(env, kubeletEnv(t, c, map[string]string{"KC_METRICS_LISTEN": "127.0.0.1:0"})...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
	})
	prom := filepath.Join(textfile, filepath.Base(metrics))
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(prom); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("kc-janitor %s exited before a round was done: %v\n%s", strings.Join(c.Args, " "), err, stderr.String())
		case <-deadline:
			t.Fatalf("no metrics file after 60s\n%s", stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The file is written at the end of the first round; reconcile must
	// have known the truth from containerd.
	data, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "ground truth unknown") {
		t.Errorf("containerd was not asked successfully:\n%s", stderr.String())
	}
	probe(t, c, servingAddr(t, stderr.String()))
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		// 143: stopped by SIGTERM after its round, as a shell reports it.
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
			t.Fatalf("after SIGTERM: %v, want exit status 143\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after SIGTERM\n%s", stderr.String())
	}
	t.Logf("metrics file: %d bytes; log:\n%s", len(data), stderr.String())
}

// kubeletEnv is c's environment as the kubelet gives it: fieldRefs
// resolved (the pod's IP is the loopback here) and $(VAR) references to
// variables defined before expanded; override replaces a value, checked
// to be a variable the manifest sets.
func kubeletEnv(t *testing.T, c corev1.Container, override map[string]string) []string {
	t.Helper()
	vals := map[string]string{}
	var out []string
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
				t.Fatalf("env %s: only status.podIP is resolved here", e.Name)
			}
			v = "127.0.0.1"
		}
		v = os.Expand(strings.NewReplacer("$(", "${", ")", "}").Replace(v), func(k string) string { return vals[k] })
		if o, ok := override[e.Name]; ok {
			v = o
			delete(override, e.Name)
		}
		vals[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	for k := range override {
		t.Fatalf("the manifest does not set %s", k)
	}
	return out
}

// servingAddr is the address watch logged it serves metrics on.
func servingAddr(t *testing.T, log string) string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "serving metrics" {
			if a, ok := rec["addr"].(string); ok {
				return a
			}
		}
	}
	t.Fatalf("watch did not log where it serves metrics:\n%s", log)
	return ""
}

// probe asks the endpoints c's probes name, as the kubelet would, and
// reads /metrics with Prometheus' parser.
func probe(t *testing.T, c corev1.Container, addr string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", what)
			continue
		}
		resp, err := hc.Get("http://" + addr + p.HTTPGet.Path)
		if err != nil {
			t.Fatalf("%s probe: %v", what, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s probe %s: %d", what, p.HTTPGet.Path, resp.StatusCode)
		}
	}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tp expfmt.TextParser
	fams, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	f := fams["kc_janitor_ground_truth_known"]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("containerd's ground truth not known in /metrics: %v", f)
	}
}
