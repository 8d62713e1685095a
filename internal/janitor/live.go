package janitor

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Live is the running watch's own metrics, served by --metrics-listen.
// Unlike the metrics file (gauges of the last run, for a process that
// exits), these are counters over the life of the process: a scraper sees
// rates and resets, not snapshots. A nil *Live drops everything.
type Live struct {
	reg *prometheus.Registry

	rounds          prometheus.Counter
	roundsFailed    prometheus.Counter
	treesReaped     prometheus.Counter
	socketsUnlinked prometheus.Counter
	deaths          *prometheus.CounterVec
	engineErrors    *prometheus.CounterVec
	lastRound       prometheus.Gauge
	lastDuration    prometheus.Gauge
	lastSuccess     prometheus.Gauge
	truth           *prometheus.GaugeVec
	deathToReap     prometheus.Histogram

	// started and finished are what /healthz judges by: a round that
	// hangs stops finished from moving. finished is the time since
	// started (ns) at which the last round ended, on the monotonic
	// clock: a wall clock stepped back (NTP) or forward (a VM resumed)
	// must not hide a stall nor make one up.
	started  time.Time
	finished atomic.Int64
}

// NewLive returns the live metrics of a watch started now.
func NewLive() *Live {
	l := &Live{
		reg: prometheus.NewRegistry(),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "kc_janitor_watch_rounds_total",
			Help: "Rounds (reconcile, sweep, cull) the watch has finished."}),
		roundsFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kc_janitor_watch_rounds_failed_total",
			Help: "Rounds that finished with a non-zero exit code (a step failed or the ground truth was unknown)."}),
		treesReaped: prometheus.NewCounter(prometheus.CounterOpts{Name: "kc_janitor_watch_trees_reaped_total",
			Help: "Stray supervisor trees reaped (or found gone while reaping) by rounds and by handled deaths."}),
		socketsUnlinked: prometheus.NewCounter(prometheus.CounterOpts{Name: "kc_janitor_watch_sockets_unlinked_total",
			Help: "Stale supervisor sockets unlinked by the rounds' sweeps."}),
		deaths: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kc_janitor_watch_deaths_handled_total",
			Help: "Container deaths handled as the engines reported them, by the engine that reported each first."}, []string{"engine"}),
		engineErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kc_janitor_watch_engine_errors_total",
			Help: "Times an engine could not be asked which containers are alive, by engine."}, []string{"engine"}),
		lastRound: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kc_janitor_watch_last_round_timestamp_seconds",
			Help: "Unix time the last round finished."}),
		lastDuration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kc_janitor_watch_last_round_duration_seconds",
			Help: "How long the last round took, in seconds."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kc_janitor_watch_last_round_success",
			Help: "1 if the last round exited 0, else 0."}),
		truth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kc_janitor_ground_truth_known",
			Help: "1 if the engine answered which containers are alive the last time it was asked, 0 if not."}, []string{"engine"}),
		deathToReap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kc_janitor_death_to_reap_seconds",
			Help:    "From a container's death (the engine's time stamp) to its trees reaped by the watch.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}),
		started: time.Now(),
	}
	l.reg.MustRegister(l.rounds, l.roundsFailed, l.treesReaped, l.socketsUnlinked, l.deaths, l.engineErrors,
		l.lastRound, l.lastDuration, l.lastSuccess, l.truth, l.deathToReap)
	return l
}

// Registry is what /metrics serves.
func (l *Live) Registry() *prometheus.Registry { return l.reg }

// round records a finished round.
func (l *Live) round(start, end time.Time, code int) {
	if l == nil {
		return
	}
	l.rounds.Inc()
	ok := 0.0
	if code == ExitOK {
		ok = 1
	} else {
		l.roundsFailed.Inc()
	}
	l.lastRound.Set(float64(end.UnixNano()) / 1e9)
	l.lastDuration.Set(end.Sub(start).Seconds())
	l.lastSuccess.Set(ok)
	l.finished.Store(int64(max(end.Sub(l.started), 1)))
}

// reconciled records what one reconcile (a round's, a death's, a
// catch-up's) did and which engines answered.
func (l *Live) reconciled(rep Report) {
	if l == nil {
		return
	}
	l.engines(rep.Engines)
	l.treesReaped.Add(float64(rep.Count(action.Reaped) + rep.Count(action.Gone)))
}

func (l *Live) engines(sts []engine.Status) {
	for _, st := range sts {
		if st.Error != nil {
			l.engineErrors.WithLabelValues(st.Name).Inc()
			l.truth.WithLabelValues(st.Name).Set(0)
			continue
		}
		l.truth.WithLabelValues(st.Name).Set(1)
	}
}

func (l *Live) swept(rep *sweep.Report) {
	if l == nil || rep == nil {
		return
	}
	n := 0
	for _, k := range rep.Sockets {
		if k.Action == sweep.ActionUnlinked {
			n++
		}
	}
	l.socketsUnlinked.Add(float64(n))
}

// death records a handled death; reaped says its trees were reaped, and
// only then is the time from the death observed: a dry run or a death
// with no trees reaps nothing and would only drag the histogram down.
func (l *Live) death(eng string, diedAt time.Time, reaped bool) {
	if l == nil {
		return
	}
	l.deaths.WithLabelValues(eng).Inc()
	if reaped && !diedAt.IsZero() {
		l.deathToReap.Observe(max(time.Since(diedAt), 0).Seconds())
	}
}

// follows makes eng's death counter present at 0 once it is followed, so
// a rate over it exists before the first death.
func (l *Live) follows(eng string) {
	if l == nil {
		return
	}
	l.deaths.WithLabelValues(eng)
}

// Healthy reports whether a round finished within limit: since the last
// round finished, or since the watch started for the first one.
func (l *Live) Healthy(now time.Time, limit time.Duration) bool {
	return now.Sub(l.started)-time.Duration(l.finished.Load()) <= limit
}
