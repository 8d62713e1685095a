// Package metrics writes kc-janitor's results in the Prometheus text format
// to a file for node_exporter's textfile collector.
//
// Every metric is a gauge describing the last run of a command: the janitor
// runs from cron or a timer, so there is no process to keep counters in.
// Several commands may share one file (reconcile, sweep and cull from one
// timer), so WriteFile merges: it replaces the series this run measured and
// keeps every other series already in the file. The file is replaced
// atomically (temporary file in the same directory, rename) under a
// lock only the janitor's user can open, held for a bounded time, so the
// collector never reads a half-written file, two commands finishing at once
// never lose each other's series, and no other user can hang a run.
package metrics

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metric names. All are gauges.
const (
	// Reconcile (also measured by doctor and watch).
	GroundTruthKnown = "kc_janitor_ground_truth_known"
	StraysFound      = "kc_janitor_strays_found"
	StraysReaped     = "kc_janitor_strays_reaped"
	StraysFailed     = "kc_janitor_strays_failed"
	Trees            = "kc_janitor_trees"

	// Sweep.
	Sockets         = "kc_janitor_sockets"
	SocketsStale    = "kc_janitor_sockets_stale"
	SocketsUnlinked = "kc_janitor_sockets_unlinked"
	SocketsFailed   = "kc_janitor_sockets_failed"

	// Cull.
	Supervisors                  = "kc_janitor_supervisors"
	SupervisorsUnreadable        = "kc_janitor_supervisors_unreadable"
	SessionsAbandoned            = "kc_janitor_sessions_abandoned"
	SessionsAbandonedMemoryBytes = "kc_janitor_sessions_abandoned_memory_bytes"

	// Doctor.
	DoctorCheck = "kc_janitor_doctor_check"

	// watch.
	WatchDeathsHandled      = "kc_janitor_watch_deaths_handled"
	WatchEventsSkipped      = "kc_janitor_watch_event_messages_skipped"
	WatchContainersFollowed = "kc_janitor_watch_live_containers"

	// Every command.
	LastRun     = "kc_janitor_last_run_timestamp_seconds"
	RunDuration = "kc_janitor_run_duration_seconds"
	RunSuccess  = "kc_janitor_run_success"
)

type desc struct {
	help   string
	labels []string
}

// catalogue lists every metric the janitor writes; Set refuses others.
var catalogue = map[string]desc{
	GroundTruthKnown: {"1 if the engines answered which containers are alive in the command's last run, 0 if not: nothing was touched then, and the stray and tree gauges, which only a run that knew could set, are left out of the file.", []string{"command"}},
	StraysFound:      {"Stray supervisor trees (container gone, old enough, ours to reap) found by the last run.", nil},
	StraysReaped:     {"Stray trees the last run reaped (or found gone while reaping); 0 in a dry run.", nil},
	StraysFailed:     {"Stray trees that would not die in the last run.", nil},
	Trees:            {"Supervisor trees seen by the last run, by decision (the reconcile action).", []string{"action"}},

	Sockets:         {"kc-*.sock sockets seen by the last sweep, by verdict.", []string{"verdict"}},
	SocketsStale:    {"Stale (orphan) supervisor sockets found by the last sweep.", nil},
	SocketsUnlinked: {"Stale sockets the last sweep unlinked; 0 in a dry run.", nil},
	SocketsFailed:   {"Stale sockets the last sweep failed to unlink.", nil},

	Supervisors:                  {"Live supervisors whose sessions the last cull audited.", nil},
	SupervisorsUnreadable:        {"Supervisors whose sessions the last cull could not read.", nil},
	SessionsAbandoned:            {"Kernel sessions idle and disconnected for longer than the threshold (audit only).", nil},
	SessionsAbandonedMemoryBytes: {"Memory held by the abandoned sessions, in bytes.", nil},

	DoctorCheck: {"Verdict of each doctor check: 0 ok, 1 warn, 2 error.", []string{"check"}},

	WatchDeathsHandled: {"Container deaths the running watch has handled as the engines reported them, by the engine that reported each first (a death reported twice counts once); 0 for an engine followed with none yet.", []string{"engine"}},

	WatchEventsSkipped: {"Event messages the running watch passed over, by engine: over 1 MiB or not the JSON the engine sends. The stream goes on; a death among them waits for the next round.", []string{"engine"}},

	WatchContainersFollowed: {"Live containers the running watch follows, by how their death is seen: pidfd (their init is pinned: seen at once) or events (the engine's death events and watch's relists: an init that could not be pinned, or past the file limit).", []string{"via"}},

	LastRun:     {"Unix time the command last finished.", []string{"command"}},
	RunDuration: {"How long the command's last run took, in seconds.", []string{"command"}},
	RunSuccess:  {"1 if the command's last run exited 0, else 0.", []string{"command"}},
}

// Names returns every metric name the janitor may write, sorted.
func Names() []string {
	out := make([]string, 0, len(catalogue))
	for n := range catalogue {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Help returns a metric's help text and label names.
func Help(name string) (string, []string) {
	d := catalogue[name]
	return d.help, d.labels
}

// Set collects the values of one run. The zero value is not usable; use
// New. A nil *Set accepts and drops everything, so callers need not check
// whether metrics were asked for.
type Set struct {
	reg    *prometheus.Registry
	gauges map[string]*prometheus.GaugeVec
	// drop names the metrics this run removes from the file: values a
	// previous run wrote that this run could not confirm.
	drop []string
}

// Drop removes the named metrics from the file when s is written, so that
// a value an earlier run measured is not read as current.
func (s *Set) Drop(names ...string) {
	if s == nil {
		return
	}
	for _, n := range names {
		if _, ok := catalogue[n]; !ok {
			panic("metrics: unknown metric " + n)
		}
	}
	s.drop = append(s.drop, names...)
}

// New returns an empty Set.
func New() *Set {
	return &Set{reg: prometheus.NewRegistry(), gauges: map[string]*prometheus.GaugeVec{}}
}

// Set records value for the metric name with the given label values (in
// the catalogue's label order). It panics on a name not in the catalogue
// or a wrong number of label values: both are programming errors.
func (s *Set) Set(name string, value float64, labelValues ...string) {
	if s == nil {
		return
	}
	d, ok := catalogue[name]
	if !ok {
		panic("metrics: unknown metric " + name)
	}
	g := s.gauges[name]
	if g == nil {
		g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: d.help}, d.labels)
		s.reg.MustRegister(g)
		s.gauges[name] = g
	}
	g.WithLabelValues(labelValues...).Set(value)
}

// Bool records 1 for true, 0 for false.
func (s *Set) Bool(name string, v bool, labelValues ...string) {
	f := 0.0
	if v {
		f = 1
	}
	s.Set(name, f, labelValues...)
}

// Run records the common per-command series: last run time, duration and
// success.
func (s *Set) Run(command string, start, end time.Time, ok bool) {
	s.Set(LastRun, float64(end.UnixNano())/1e9, command)
	s.Set(RunDuration, end.Sub(start).Seconds(), command)
	s.Bool(RunSuccess, ok, command)
}

// Empty reports whether nothing was recorded.
func (s *Set) Empty() bool { return s == nil || len(s.gauges) == 0 && len(s.drop) == 0 }

// Gather returns the recorded families.
func (s *Set) Gather() ([]*dto.MetricFamily, error) {
	if s == nil {
		return nil, nil
	}
	return s.reg.Gather()
}

// Parse reads a text-format exposition.
func Parse(data []byte) (map[string]*dto.MetricFamily, error) {
	var p expfmt.TextParser
	return p.TextToMetricFamilies(bytes.NewReader(data))
}

// Merge returns old with every series of fresh put in: a series of fresh
// replaces the series of old with the same name and labels; the rest of old
// is kept. The result is sorted by name.
func Merge(old map[string]*dto.MetricFamily, fresh []*dto.MetricFamily) []*dto.MetricFamily {
	byName := map[string]*dto.MetricFamily{}
	for n, f := range old {
		byName[n] = f
	}
	for _, nf := range fresh {
		of := byName[nf.GetName()]
		// A family whose labels changed (an older release's) is replaced
		// whole: one family must not mix label sets.
		if of == nil || of.GetType() != nf.GetType() || labelNames(of) != labelNames(nf) {
			byName[nf.GetName()] = nf
			continue
		}
		merged := &dto.MetricFamily{Name: nf.Name, Help: nf.Help, Type: nf.Type}
		replaced := map[string]bool{}
		for _, m := range nf.Metric {
			replaced[labelKey(m)] = true
		}
		for _, m := range of.Metric {
			if !replaced[labelKey(m)] {
				merged.Metric = append(merged.Metric, m)
			}
		}
		merged.Metric = append(merged.Metric, nf.Metric...)
		sort.Slice(merged.Metric, func(i, j int) bool { return labelKey(merged.Metric[i]) < labelKey(merged.Metric[j]) })
		byName[nf.GetName()] = merged
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// labelNames is the sorted label names of a family's first series.
func labelNames(f *dto.MetricFamily) string {
	if len(f.Metric) == 0 {
		return ""
	}
	var ns []string
	for _, l := range f.Metric[0].Label {
		ns = append(ns, l.GetName())
	}
	sort.Strings(ns)
	return strings.Join(ns, ",")
}

func labelKey(m *dto.Metric) string {
	ps := make([]string, 0, len(m.Label))
	for _, l := range m.Label {
		ps = append(ps, l.GetName()+"\x00"+l.GetValue())
	}
	sort.Strings(ps)
	return strings.Join(ps, "\x01")
}

// Encode renders families in the text format.
func Encode(fams []*dto.MetricFamily) ([]byte, error) {
	var b bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", f.GetName(), err)
		}
	}
	return b.Bytes(), nil
}
