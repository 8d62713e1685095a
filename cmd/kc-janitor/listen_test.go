package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestWatchMetricsListen: the real command serves /metrics (valid text
// format, rounds counted, podman's truth unknown), /healthz and /readyz on
// the address it logs, the probes alone on --health-listen's, and stops
// serving when it stops.
func TestWatchMetricsListen(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "watch.log")
	t.Setenv("PATH", t.TempDir())
	res := make(chan int, 1)
	go func() {
		code, _ := runJanitorCapture(t, "watch", "--interval", "100ms", "--podman-url", "unix:///nonexistent/podman.sock",
			"--podman-timeout", "1s", "--socket-dir", t.TempDir(), "--state-dir", filepath.Join(dir, "state"),
			"--log-file", logFile, "--log-format", "json", "--metrics-listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--no-events")
		res <- code
	}()
	proc.WaitFor(t, time.Minute, "the log lines", func() bool { return countLines(logFile, `"msg":"round failed`) >= 2 })
	addrs := map[string]string{}
	data, _ := os.ReadFile(logFile)
	for _, line := range strings.Split(string(data), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, "serving ") {
				addrs[msg], _ = rec["addr"].(string)
			}
		}
	}
	addr, health := addrs["serving metrics"], addrs["serving health probes"]
	if addr == "" || health == "" {
		t.Fatalf("no serving metrics or health probes line:\n%s", data)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		addr, path string
		want       int
	}{{addr, "/healthz", 200}, {addr, "/readyz", 200}, {health, "/healthz", 200}, {health, "/readyz", 200}, {health, "/metrics", 404}} {
		resp, err := c.Get("http://" + tc.addr + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s%s %d, want %d", tc.addr, tc.path, resp.StatusCode, tc.want)
		}
	}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics: %v\n%s", err, body)
	}
	if f := fams["kc_janitor_watch_rounds_total"]; f == nil || f.Metric[0].GetCounter().GetValue() < 2 {
		t.Errorf("rounds %v", f)
	}
	if v, ok := gauge(fams, "kc_janitor_ground_truth_known", "engine", "podman"); !ok || v != 0 {
		t.Errorf("podman's ground truth known %v %v, want 0", v, ok)
	}

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-res:
		if code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d after SIGTERM, want 143", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not stop on SIGTERM")
	}
	for _, a := range []string{addr, health} {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			conn.Close()
			t.Errorf("still serving on %s after watch stopped", a)
		}
	}
}

// TestWatchMetricsListenBindError: an address in use fails at start with
// exit 2, before any round.
func TestWatchMetricsListenBindError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("PATH", t.TempDir())
	code, out := runJanitorCapture(t, "watch", "--podman-url", "unix:///nonexistent/podman.sock", "--socket-dir", t.TempDir(),
		"--metrics-listen", ln.Addr().String())
	if code != exitUsage {
		t.Errorf("exit %d, want 2: %s", code, out)
	}
	// The timer's --once shares /etc/default/kc-janitor with the watch
	// service: it serves nothing and is not failed by the setting.
	t.Setenv("KC_METRICS_LISTEN", ln.Addr().String())
	if code, out := runJanitorCapture(t, "watch", "--once", "--podman-url", "unix:///nonexistent/podman.sock", "--socket-dir", t.TempDir()); code != exitUnknown {
		t.Errorf("--once with KC_METRICS_LISTEN: exit %d, want 3 (podman unreachable)\n%s", code, out)
	}
}
