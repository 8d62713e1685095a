package janitor

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func value(f *dto.MetricFamily, labels ...string) (float64, bool) {
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMetricsServer: over real HTTP, /metrics is valid exposition with
// the round's, the sweep's and a handled death's counts (the histogram
// observed once, the death having reaped), /readyz answers, and /healthz
// goes 503 once rounds stop finishing.
func TestMetricsServer(t *testing.T) {
	live := NewLive()
	log := slog.New(slog.DiscardHandler)
	// Long enough that a loaded machine still reaches /healthz between a
	// round and this limit, short enough to wait out below.
	const stale = 2 * time.Second
	srv, err := Listen("127.0.0.1:0", live, stale, log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + srv.Addr()

	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d before any round, want 200", code)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d just after start, want 200", code)
	}

	// One round: podman down, docker up; one socket unlinked.
	msg := "connection refused"
	start := time.Now()
	live.reconciled(Report{Report: reconcile.Report{Trees: []reconcile.Tree{{Action: action.Reaped}}},
		Engines: []engine.Status{{Name: "podman", Error: &msg}, {Name: "docker"}}})
	live.swept(&sweep.Report{Sockets: []*sweep.Socket{{Action: sweep.ActionUnlinked}, {}}})
	live.round(start, time.Now(), ExitUnknown)

	// A death through the real handler, reaping one tree.
	id := strings.Repeat("ab", 32)
	var serial sync.Mutex
	w := Watch{Live: live}
	w.Reconcile.Apply = true
	h := newDeathHandler(w, log, &serial, t.Context(), t.Context())
	h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
		return Report{Report: reconcile.Report{LivenessKnown: true, Trees: []reconcile.Tree{{ContainerID: id, PGID: 7, Action: action.Reaped}}},
			Engines: []engine.Status{{Name: "containerd"}}}, nil, nil
	}
	h.death(engine.Death{Engine: "containerd", ID: id, At: time.Now().Add(-time.Second)})
	h.close()

	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics %d: %s", code, body)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not the text format: %v\n%s", err, body)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kc_janitor_watch_rounds_total", nil, 1},
		{"kc_janitor_watch_rounds_failed_total", nil, 1},
		{"kc_janitor_watch_last_round_success", nil, 0},
		{"kc_janitor_watch_trees_reaped_total", nil, 2},
		{"kc_janitor_watch_sockets_unlinked_total", nil, 1},
		{"kc_janitor_watch_deaths_handled_total", []string{"engine", "containerd"}, 1},
		{"kc_janitor_watch_engine_errors_total", []string{"engine", "podman"}, 1},
		{"kc_janitor_ground_truth_known", []string{"engine", "podman"}, 0},
		{"kc_janitor_ground_truth_known", []string{"engine", "docker"}, 1},
		{"kc_janitor_ground_truth_known", []string{"engine", "containerd"}, 1},
		{"kc_janitor_death_to_reap_seconds", nil, 1},
	} {
		if v, ok := value(fams[tc.name], tc.labels...); !ok || v != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.name, tc.labels, v, ok, tc.want)
		}
	}
	if h := fams["kc_janitor_death_to_reap_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleSum() < 1 {
		t.Errorf("death to reap %vs, want at least the 1s since the death", h.GetSampleSum())
	}

	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d right after a round: %s", code, body)
	}
	// No round finishes any more (as when one is blocked).
	proc.WaitFor(t, 10*time.Second, "/healthz to fail", func() bool {
		code, _ := get(t, base+"/healthz")
		return code == http.StatusServiceUnavailable
	})
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d with rounds stalled, want 200 (a restart is the liveness probe's)", code)
	}
}

// TestMetricsServerDryRunDeath: a death handled in a dry run reaps
// nothing and leaves the histogram empty.
// TestMetricsServerBoundsItsClients: a client's header past the bound is
// refused (431), not held; connections past the cap wait, and are
// served once others close.
func TestMetricsServerBoundsItsClients(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", NewLive(), time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, "http://"+srv.Addr()+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Padding", strings.Repeat("a", 64<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 64 KiB header: %d, want %d", resp.StatusCode, http.StatusRequestHeaderFieldsTooLarge)
	}
	// The cap's worth of idle connections, then a probe: it is served
	// once one of them goes.
	var held []net.Conn
	for range maxMetricsConns {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	got := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + srv.Addr() + "/readyz")
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	select {
	case code := <-got:
		t.Fatalf("a probe past the cap was served (%d) while %d connections were held", code, len(held))
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	select {
	case code := <-got:
		if code != http.StatusOK {
			t.Errorf("the probe: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Error("the probe was not served once a connection closed")
	}
	for _, c := range held[1:] {
		c.Close()
	}
}

func TestMetricsServerDryRunDeath(t *testing.T) {
	live := NewLive()
	var serial sync.Mutex
	h := newDeathHandler(Watch{Live: live}, slog.New(slog.DiscardHandler), &serial, t.Context(), t.Context())
	id := strings.Repeat("cd", 32)
	h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
		return Report{Report: reconcile.Report{DryRun: true, LivenessKnown: true, Trees: []reconcile.Tree{{ContainerID: id, Action: action.WouldReap}}}}, nil, nil
	}
	h.death(engine.Death{Engine: "docker", ID: id, At: time.Now()})
	h.close()
	fams, err := live.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "kc_janitor_death_to_reap_seconds" && f.GetMetric()[0].GetHistogram().GetSampleCount() != 0 {
			t.Errorf("a dry-run death was observed")
		}
	}
}

// TestListenBindError: an address in use is an error from Listen, before
// anything is served.
func TestListenBindError(t *testing.T) {
	live := NewLive()
	srv, err := Listen("127.0.0.1:0", live, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if s2, err := Listen(srv.Addr(), live, time.Minute, slog.New(slog.DiscardHandler)); err == nil {
		s2.Close()
		t.Fatal("a second bind of the same address succeeded")
	}
}

// TestHealthyByTheMonotonicClock: /healthz judges the time since the last
// round ended (or since the start) on the monotonic clock.
func TestHealthyByTheMonotonicClock(t *testing.T) {
	l := NewLive()
	limit := time.Minute
	if !l.Healthy(l.started.Add(limit-time.Second), limit) || l.Healthy(l.started.Add(limit+time.Second), limit) {
		t.Error("before any round: not judged from the start")
	}
	end := l.started.Add(10 * time.Minute)
	l.round(end.Add(-time.Second), end, 0)
	if !l.Healthy(end.Add(limit-time.Second), limit) || l.Healthy(end.Add(limit+time.Second), limit) {
		t.Error("after a round: not judged from its end")
	}
}

// TestStaleAfter: /healthz waits twice the interval plus what one round
// may take within its bounds; the manifest's figure (contrib/kubernetes:
// 15m interval, the defaults otherwise) is 32m58s.
func TestStaleAfter(t *testing.T) {
	if got := StaleAfter(15*time.Minute, 30*time.Second, 10*time.Second, 5*time.Second, 0); got != 32*time.Minute+58*time.Second {
		t.Errorf("StaleAfter = %v, want 32m58s", got)
	}
	// Each container swept costs its deadline and its lookup more.
	if d := StaleAfter(time.Minute, 30*time.Second, 10*time.Second, 5*time.Second, 3) - StaleAfter(time.Minute, 30*time.Second, 10*time.Second, 5*time.Second, 1); d != 2*(30*time.Second+30*time.Second) {
		t.Errorf("two more containers cost %v, want 2m", d)
	}
}

// TestHealthListenerOfItsOwn: with every metrics connection held (anyone
// who reaches the metrics port can hold them), the probes on the health
// listener are still answered; it serves the probes alone.
func TestHealthListenerOfItsOwn(t *testing.T) {
	live := NewLive()
	log := slog.New(slog.DiscardHandler)
	metrics, err := Listen("127.0.0.1:0", live, time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	defer metrics.Close()
	health, err := ListenHealth("127.0.0.1:0", live, time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	defer health.Close()
	for range maxMetricsConns {
		c, err := net.Dial("tcp", metrics.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if resp, err := (&http.Client{Timeout: 300 * time.Millisecond}).Get("http://" + metrics.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("the metrics listener answered (%d) with its %d connections held", resp.StatusCode, maxMetricsConns)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": http.StatusOK, "/metrics": http.StatusNotFound} {
		resp, err := c.Get("http://" + health.Addr() + path)
		if err != nil {
			t.Fatalf("%s on the health listener: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s on the health listener: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
