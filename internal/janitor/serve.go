package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
)

// MetricsServer serves a watch's /metrics, /healthz and /readyz, or the
// probes alone (ListenHealth).
type MetricsServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	what string // "metrics" or "health probes"
}

// Listen binds addr now, so that a port in use is the caller's startup
// error and not a log line after the watch has begun. staleAfter is how
// long /healthz tolerates no round finishing.
func Listen(addr string, live *Live, staleAfter time.Duration, log *slog.Logger) (*MetricsServer, error) {
	mux := probes(live, staleAfter)
	mux.Handle("/metrics", promhttp.HandlerFor(live.Registry(), promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	return serve(addr, mux, maxMetricsConns, "metrics", log)
}

// ListenHealth is Listen for /healthz and /readyz alone, on a listener of
// their own: anyone who can reach the metrics port can hold its
// connections, and a liveness probe that cannot get one restarts the
// watch. Bound to loopback (the DaemonSet's probes ask 127.0.0.1), it
// is the node's own processes' alone (hostNetwork pods included).
func ListenHealth(addr string, live *Live, staleAfter time.Duration, log *slog.Logger) (*MetricsServer, error) {
	return serve(addr, probes(live, staleAfter), maxHealthConns, "health probes", log)
}

// probes is a mux serving /healthz and /readyz.
func probes(live *Live, staleAfter time.Duration) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !live.Healthy(time.Now(), staleAfter) {
			// A hung round (an engine call or a kill that never returns)
			// is what a restart cures; an engine that is down is not: its
			// rounds finish, failed, and show in the gauges.
			http.Error(w, fmt.Sprintf("no round finished in the last %s", staleAfter), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Ready as soon as it answers: an unready DaemonSet pod stalls every
	// rollout, and an engine that is down is an alert, not a reason to.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	return mux
}

// serve binds addr and serves mux to at most conns clients at once.
func serve(addr string, mux *http.ServeMux, conns int, what string, log *slog.Logger) (*MetricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", what, err)
	}
	// Anyone who can reach the port (a local user, any pod on the node)
	// could otherwise hold connections without end: descriptors the
	// watch needs for its pidfds and engines, and memory.
	ln = netutil.LimitListener(ln, conns)
	s := &MetricsServer{
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 10 * time.Second, MaxHeaderBytes: maxMetricsHeader},
		ln:   ln,
		done: make(chan struct{}),
		what: what,
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(what+" server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("serving "+what, "addr", ln.Addr().String())
	return s, nil
}

// Bounds on the servers' clients: a scrape or probe sends a few hundred
// bytes of header; the kubelet probes one at a time.
const (
	maxMetricsConns  = 64
	maxHealthConns   = 8
	maxMetricsHeader = 8 << 10
)

// Addr is the address bound (the port chosen for ":0").
func (s *MetricsServer) Addr() string { return s.ln.Addr().String() }

// Close shuts the server down, giving requests under way a moment.
func (s *MetricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	<-s.done
	if err != nil {
		return fmt.Errorf("stopping the %s server: %w", s.what, err)
	}
	return nil
}

// StaleAfter is how long /healthz waits for a round: twice the interval
// plus everything one round may wait for within its bounds, so a slow
// round is not a restart: a sweep deadline per socket target and one for
// the audit, a lookup of each target, the engines asked twice, the apply
// lock and a kill's grace and wait.
func StaleAfter(interval, sweepDeadline, engineTimeout, killGrace time.Duration, targets int) time.Duration {
	targets = max(targets, 1)
	const resolve, killWait = 30 * time.Second, 3 * time.Second
	return 2*interval + time.Duration(targets+1)*sweepDeadline + time.Duration(targets)*resolve +
		2*engineTimeout + ApplyLockWait + killGrace + killWait
}
