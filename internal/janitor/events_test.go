package janitor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// records returns the logged JSON records with message msg.
func (s *syncBuffer) records(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(s.b.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(l), &r) == nil && r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

func jsonLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

func dieEvent(id string) string { return dieEventAt(id, time.Now()) }

func dieEventAt(id string, at time.Time) string {
	return fmt.Sprintf(`{"Type":"container","Action":"die","timeNano":%d,"Actor":{"ID":%q}}`+"\n", at.UnixNano(), id)
}

// fakeEvents serves a Docker /events on a real unix socket: the n-th
// subscription (from 0) gets what answer writes; the stream ends when
// answer returns.
func fakeEvents(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) (engine.Engine, *atomic.Int32) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/events") {
			http.NotFound(w, r)
			return
		}
		answer(int(n.Add(1)-1), w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	es, err := engine.Select([]string{"docker"}, engine.Config{DockerURL: "unix://" + sock})
	if err != nil {
		t.Fatal(err)
	}
	return es[0], &n
}

// TestFollowDeathsResubscribes: a stream that drops is subscribed again
// with a growing delay, capped, and reset after a healthy stream; deaths
// from every subscription arrive, a new subscription asks dockerd to
// replay the deaths since just before the drop, and is reported as
// resumed (watch then catches up).
func TestFollowDeathsResubscribes(t *testing.T) {
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	for _, tc := range []struct {
		name    string
		healthy time.Duration
		want    string // retry_in after each of the five drops
	}{
		{"backoff grows to its cap", time.Hour, "10ms 20ms 40ms 40ms 40ms"},
		{"a healthy stream resets it", 0, "10ms 10ms 10ms 10ms 10ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sinces sync.Map
			// A death stamped long before now: only its own stamp can be
			// the next since, not local time at the drop.
			atA := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
			stampA := fmt.Sprintf("%d.%09d", atA.Unix(), atA.Nanosecond())
			e, subs := fakeEvents(t, func(n int, w http.ResponseWriter, r *http.Request) {
				sinces.Store(n, r.URL.Query().Get("since"))
				if n == 3 || n == 4 { // dockerd refusing: no subscription
					http.Error(w, `{"message":"busy"}`, http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusOK)
				switch n {
				case 0:
					w.Write([]byte(dieEventAt(a, atA)))
				case 1:
					// The replay from since holds the death at it again:
					// passed on once.
					w.Write([]byte(dieEventAt(a, atA)))
					w.Write([]byte("{not json\n"))
				case 5:
					w.Write([]byte(dieEvent(b)))
					w.(http.Flusher).Flush()
					<-r.Context().Done() // a stream that holds
				}
			})
			log, buf := jsonLogger()
			ctx, cancel := context.WithCancel(t.Context())
			deaths := make(chan engine.Death, 10)
			done := make(chan struct{})
			var readies []bool
			var mu sync.Mutex
			var skips atomic.Int32
			go func() {
				followDeaths(ctx, e, backoff{min: 10 * time.Millisecond, max: 40 * time.Millisecond, healthy: tc.healthy}, log,
					func(resumed bool) { mu.Lock(); readies = append(readies, resumed); mu.Unlock() },
					func(d engine.Death) { deaths <- d }, func() { skips.Add(1) })
				close(done)
			}()
			var got []string
			deadline := time.After(20 * time.Second)
			for len(got) < 2 {
				select {
				case d := <-deaths:
					got = append(got, d.ID)
				case <-deadline:
					t.Fatalf("deaths %v after %d subscriptions", got, subs.Load())
				}
			}
			cancel()
			<-done
			if got[0] != a || got[1] != b {
				t.Errorf("deaths %v, want %s then %s", got, a[:8], b[:8])
			}
			if subs.Load() != 6 {
				t.Errorf("%d subscriptions, want 6", subs.Load())
			}
			if skips.Load() != 1 || len(buf.records("event message passed over; the stream goes on")) != 1 {
				t.Errorf("%d messages counted as passed over, want 1 (the one that is not JSON)", skips.Load())
			}
			drops := buf.records("container death events dropped; subscribing again")
			var retries []string
			for _, r := range drops {
				retries = append(retries, time.Duration(r["retry_in"].(float64)).String())
			}
			if got := strings.Join(retries, " "); got != tc.want {
				t.Errorf("retry delays %s, want %s", got, tc.want)
			}
			for n := range 6 {
				s, _ := sinces.Load(n)
				if s == nil || s == "" {
					t.Errorf("subscription %d asked no since: deaths while it was down would be lost", n)
				}
			}
			// After the first death every subscription asks from that
			// death's own stamp, not from local time at its drop.
			s0, _ := sinces.Load(0)
			for n := 1; n < 6; n++ {
				if s, _ := sinces.Load(n); s != stampA {
					t.Errorf("subscription %d asked since %v, want %v (the last death's own time; the first asked %v)", n, s, stampA, s0)
				}
			}
			if len(buf.records("following container deaths")) != 4 {
				t.Errorf("not every subscription was logged")
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(readies) != "[false true true true]" {
				t.Errorf("ready(resumed) calls %v: only the subscriptions after a drop are resumed ones", readies)
			}
		})
	}
}

// TestFollowDeathsNoEvents: an engine without death events is asked once.
func TestFollowDeathsNoEvents(t *testing.T) {
	log, buf := jsonLogger()
	done := make(chan struct{})
	go func() {
		followDeaths(t.Context(), noEvents{}, resubscribe(), log, nil, func(engine.Death) { t.Error("a death from nowhere") }, nil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("followDeaths kept asking an engine without events")
	}
	if len(buf.records("container death events dropped; subscribing again")) != 0 {
		t.Error("no events was taken for a dropped stream")
	}
}

type noEvents struct{ engine.Engine }

func (noEvents) Name() string     { return "podman" }
func (noEvents) Endpoint() string { return "unix:///run/podman/podman.sock" }
func (noEvents) Deaths(context.Context, engine.DeathWatch) error {
	return engine.ErrNoEvents
}

// scriptedAttempts stands for Reconcile: each container's n-th attempt
// gets the n-th action of its script (the last one repeats), optionally
// after gate is closed.
type scriptedAttempts struct {
	mu      sync.Mutex
	scripts map[string][]action.Action
	calls   map[string]int
	gate    chan struct{}
	busy    atomic.Int32
	overlap atomic.Bool
	// diedAt are the times each container's attempts were decided by.
	diedAt map[string][]time.Time
}

func (s *scriptedAttempts) attempt(_ context.Context, opt reconcile.Options, _ *slog.Logger) (Report, error, error) {
	if s.busy.Add(1) > 1 {
		s.overlap.Store(true)
	}
	defer s.busy.Add(-1)
	if s.gate != nil {
		<-s.gate
	}
	rep := Report{Report: reconcile.Report{LivenessKnown: true}}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(opt.Containers)) {
		n := s.calls[id]
		s.calls[id]++
		if s.diedAt != nil {
			s.diedAt[id] = append(s.diedAt[id], opt.DiedAtByID[id])
		}
		script := s.scripts[id]
		if len(script) == 0 {
			panic("no script for " + id)
		}
		a := script[min(n, len(script)-1)]
		rep.Trees = append(rep.Trees, reconcile.Tree{ContainerID: id, PGID: 100 + len(rep.Trees), Action: a})
	}
	return rep, nil, nil
}

// scriptedHandler is a death handler deciding through sa, asking again
// a millisecond after a death still looks live, logging JSON into the
// returned buffer.
func scriptedHandler(t *testing.T, sa *scriptedAttempts) (*deathHandler, *syncBuffer) {
	log, buf := jsonLogger()
	h := newDeathHandler(Watch{}, log, new(sync.Mutex), t.Context(), t.Context())
	h.retries = []time.Duration{time.Millisecond}
	h.attempt = sa.attempt
	return h, buf
}

// handledCount is how many deaths reported by eng h counted.
func (h *deathHandler) handledCount(eng string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.handled[eng]
}

func (s *scriptedAttempts) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

// TestDeathHandler: one death reported by several engines is handled
// once; a container still live is asked again and then reaped; attempts
// never overlap; a death outside --container is left alone; a crash while
// handling one death does not stop the next.
func TestDeathHandler(t *testing.T) {
	dup, slow, scoped, crash, after := strings.Repeat("d1", 32), strings.Repeat("e2", 32), strings.Repeat("f3", 32), strings.Repeat("c4", 32), strings.Repeat("a5", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, gate: make(chan struct{}), scripts: map[string][]action.Action{
		dup:   {action.Reaped},
		slow:  {action.SkipLive, action.SkipContradicted, action.Reaped},
		after: {action.WouldReap},
	}}
	log, buf := jsonLogger()
	var serial sync.Mutex
	w := Watch{}
	w.Reconcile.Containers = map[string]bool{dup: true, slow: true, crash: true, after: true}
	h := newDeathHandler(w, log, &serial, t.Context(), t.Context())
	h.retries = []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}
	h.attempt = sa.attempt

	now := time.Now()
	h.death(engine.Death{Engine: "containerd", ID: dup, At: now})
	h.death(engine.Death{Engine: "docker", ID: dup, At: now}) // in flight
	h.death(engine.Death{Engine: "docker", ID: slow, At: now})
	h.death(engine.Death{Engine: "docker", ID: scoped, At: now})
	close(sa.gate)
	proc.WaitFor(t, time.Minute, "two deaths handled", func() bool { return len(buf.records("container death handled")) == 2 })
	// A crash loses its own burst to the next round, not the next death.
	h.death(engine.Death{Engine: "docker", ID: crash, At: now})
	proc.WaitFor(t, time.Minute, "the crash", func() bool {
		return len(buf.records("handling a container death crashed; the next round covers it")) == 1
	})
	h.death(engine.Death{Engine: "containerd", ID: dup, At: now}) // just handled
	h.death(engine.Death{Engine: "docker", ID: after, At: now})
	h.close()

	for _, tc := range []struct {
		id    string
		calls int
	}{{dup, 1}, {slow, 3}, {scoped, 0}, {crash, 1}, {after, 1}} {
		if got := sa.count(tc.id); got != tc.calls {
			t.Errorf("container %s: %d attempts, want %d", tc.id[:4], got, tc.calls)
		}
	}
	if sa.overlap.Load() {
		t.Error("two attempts ran at once")
	}
	handled := map[string]map[string]any{}
	for _, r := range buf.records("container death handled") {
		handled[r["container"].(string)] = r
	}
	if len(handled) != 3 || handled[slow]["reaped"] != float64(1) || handled[slow]["attempts"] != float64(3) ||
		handled[dup]["engine"] != "containerd" || handled[after]["would_reap"] != float64(1) {
		t.Errorf("handled lines: %v", handled)
	}
	if len(buf.records("handling a container death crashed; the next round covers it")) != 1 {
		t.Error("the crash was not logged")
	}
	if h.handled["containerd"] != 1 || h.handled["docker"] != 2 {
		t.Errorf("handled by engine %v, want containerd 1, docker 2", h.handled)
	}
}

// TestDeathHandlerCatchUp: after a stream was down, one reconcile covers
// watch's whole scope (not one container); those asked for while it runs
// make one more after it; none starts once the handler is closed.
func TestDeathHandlerCatchUp(t *testing.T) {
	a, b := strings.Repeat("a6", 32), strings.Repeat("b7", 32)
	log, buf := jsonLogger()
	var serial sync.Mutex
	w := Watch{}
	w.Reconcile.Containers = map[string]bool{a: true, b: true}
	h := newDeathHandler(w, log, &serial, t.Context(), t.Context())
	gate := make(chan struct{})
	var calls atomic.Int32
	var scope sync.Map
	h.attempt = func(_ context.Context, opt reconcile.Options, _ *slog.Logger) (Report, error, error) {
		calls.Add(1)
		for id := range opt.Containers {
			scope.Store(id, true)
		}
		<-gate
		return Report{Report: reconcile.Report{LivenessKnown: true, Trees: []reconcile.Tree{
			{ContainerID: a, PGID: 10, Action: action.Reaped}, {ContainerID: b, PGID: 11, Action: action.SkipLive}}}}, nil, nil
	}
	h.catchUp("containerd")
	proc.WaitFor(t, time.Minute, "the first catch-up", func() bool { return calls.Load() == 1 })
	// While it runs: one more after it, for both.
	h.catchUp("docker")
	h.catchUp("cri")
	h.catchUp("docker")
	close(gate)
	proc.WaitFor(t, time.Minute, "the catch-ups", func() bool { return len(buf.records("caught up after the event stream was down")) == 2 })
	h.close()
	h.catchUp("containerd")
	if n := calls.Load(); n != 2 {
		t.Errorf("%d catch-ups ran, want 2", n)
	}
	if l := buf.records("caught up after the event stream was down")[1]; l["engine"] != "cri,docker" {
		t.Errorf("the second catch-up is for %v, want cri,docker", l["engine"])
	}
	for _, id := range []string{a, b} {
		if _, ok := scope.Load(id); !ok {
			t.Errorf("the catch-up was not asked about %s", id[:4])
		}
	}
	l := buf.records("caught up after the event stream was down")[0]
	if l["reaped"] != float64(1) || l["trees"] != float64(2) || l["engine"] != "containerd" {
		t.Errorf("catch-up line %v", l)
	}
}

// TestDeathHandlerCatchUpTriesAgain: a catch-up whose ground truth is
// unknown (an engine still coming back) is tried again, and then done;
// one that stays unknown gives up after its retries, touching nothing.
func TestDeathHandlerCatchUpTriesAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		unknown  int32 // attempts whose truth is unknown
		attempts int32
		caught   bool
	}{
		{"back on the second try", 1, 2, true},
		{"never back", 100, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, buf := jsonLogger()
			var serial sync.Mutex
			h := newDeathHandler(Watch{}, log, &serial, t.Context(), t.Context())
			h.catchUpRetries = []time.Duration{time.Millisecond, time.Millisecond}
			var calls atomic.Int32
			h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
				if calls.Add(1) <= tc.unknown {
					return Report{}, fmt.Errorf("%w: containerd is starting", engine.ErrUnknown), nil
				}
				return Report{Report: reconcile.Report{LivenessKnown: true}}, nil, nil
			}
			h.catchUp("containerd")
			proc.WaitFor(t, time.Minute, "the catch-up to end", func() bool {
				return len(buf.records("caught up after the event stream was down"))+
					len(buf.records("not caught up after the event stream was down: ground truth unknown; nothing touched")) == 1
			})
			h.close()
			if n := calls.Load(); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			if got := len(buf.records("caught up after the event stream was down")) == 1; got != tc.caught {
				t.Errorf("caught up: %v, want %v", got, tc.caught)
			}
		})
	}
}

// TestDeathHandlerBurst: deaths reported within the burst window (a node
// drain) are decided on one scan and one engine question, each with its
// own time of death, and each still gets its own line.
func TestDeathHandlerBurst(t *testing.T) {
	const n = 50
	sa := &scriptedAttempts{calls: map[string]int{}, scripts: map[string][]action.Action{}}
	log, buf := jsonLogger()
	var serial sync.Mutex
	h := newDeathHandler(Watch{}, log, &serial, t.Context(), t.Context())
	var diedAt sync.Map
	h.attempt = func(ctx context.Context, opt reconcile.Options, l *slog.Logger) (Report, error, error) {
		for id, at := range opt.DiedAtByID {
			diedAt.Store(id, at)
		}
		return sa.attempt(ctx, opt, l)
	}
	at := time.Now()
	for i := range n {
		id := strings.Repeat(fmt.Sprintf("%02x", i), 32)
		sa.scripts[id] = []action.Action{action.Reaped}
		h.death(engine.Death{Engine: "podman", ID: id, At: at.Add(time.Duration(i) * time.Microsecond)})
	}
	proc.WaitFor(t, time.Minute, "the burst handled", func() bool { return len(buf.records("container death handled")) == n })
	h.close()
	if got := h.scans.Load(); got != 1 {
		t.Errorf("%d scans for a burst of %d deaths, want 1", got, n)
	}
	for i := range n {
		id := strings.Repeat(fmt.Sprintf("%02x", i), 32)
		if v, _ := diedAt.Load(id); v != at.Add(time.Duration(i)*time.Microsecond) {
			t.Errorf("container %s decided with death time %v", id[:4], v)
		}
	}
	for _, r := range buf.records("container death handled") {
		if r["reaped"] != float64(1) || r["burst"] != float64(n) {
			t.Errorf("death line %v", r)
		}
	}
}

// TestDeathHandlerSlowUnknownTruth: the retries of a death whose truth is
// unknown end with the backoff's time, not only its steps: an engine that
// answers nothing until its timeout on every attempt does not hold the
// rounds for ten such attempts.
func TestDeathHandlerSlowUnknownTruth(t *testing.T) {
	id := strings.Repeat("e9", 32)
	log, buf := jsonLogger()
	var serial sync.Mutex
	h := newDeathHandler(Watch{}, log, &serial, t.Context(), t.Context())
	h.retries = slices.Repeat([]time.Duration{time.Millisecond}, 9)
	var calls atomic.Int32
	h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
		calls.Add(1)
		time.Sleep(20 * time.Millisecond) // the engine's timeout, scaled down
		return Report{}, fmt.Errorf("%w: dockerd did not answer in time", engine.ErrUnknown), nil
	}
	h.death(engine.Death{Engine: "docker", ID: id, At: time.Now()})
	proc.WaitFor(t, time.Minute, "the death given up", func() bool {
		return len(buf.records("container death not handled: ground truth unknown; nothing touched")) == 1
	})
	h.close()
	if n := calls.Load(); n > 2 {
		t.Errorf("%d attempts of 20 ms each within a 9 ms budget, want at most 2", n)
	}
}

// TestDeathHandlerSlowAttemptsStillRetry: time that is not an engine
// failing to answer (a slow scan, the wait behind a round, a burst-mate's
// grace) does not use up the retries of a death the engine still calls
// live: it is asked again until the engine agrees.
func TestDeathHandlerSlowAttemptsStillRetry(t *testing.T) {
	id := strings.Repeat("fa", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, scripts: map[string][]action.Action{
		id: {action.SkipLive, action.SkipLive, action.SkipLive, action.Reaped},
	}}
	log, buf := jsonLogger()
	var serial sync.Mutex
	h := newDeathHandler(Watch{}, log, &serial, t.Context(), t.Context())
	h.retries = slices.Repeat([]time.Duration{time.Millisecond}, 9)
	h.attempt = func(ctx context.Context, opt reconcile.Options, l *slog.Logger) (Report, error, error) {
		time.Sleep(20 * time.Millisecond) // longer than the whole backoff
		return sa.attempt(ctx, opt, l)
	}
	h.death(engine.Death{Engine: "docker", ID: id, At: time.Now()})
	proc.WaitFor(t, time.Minute, "the death handled", func() bool { return len(buf.records("container death handled")) == 1 })
	h.close()
	if r := buf.records("container death handled")[0]; r["reaped"] != float64(1) || r["attempts"] != float64(4) {
		t.Errorf("handled: %v; want reaped on the 4th attempt", r)
	}
}

// TestDeathHandlerNudged: a dead container the engine still calls live is
// asked again as soon as another source reports its death (dockerd's
// "die" after the pidfd), not on the backoff's next step, here an hour
// away; a nudged attempt takes no step of the backoff, so two of them
// still leave the one step there is.
func TestDeathHandlerNudged(t *testing.T) {
	id := strings.Repeat("d8", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, scripts: map[string][]action.Action{
		id: {action.SkipLive, action.SkipLive, action.Reaped},
	}}
	log, buf := jsonLogger()
	var serial sync.Mutex
	stop, cancel := context.WithCancel(t.Context())
	h := newDeathHandler(Watch{}, log, &serial, t.Context(), stop)
	h.retries = []time.Duration{time.Hour}
	h.attempt = sa.attempt
	defer h.close()
	defer cancel() // first: a failed run ends its hour's wait

	now := time.Now()
	h.death(engine.Death{Engine: "docker", ID: id, At: now, Via: "pidfd"})
	for n := 1; n <= 2; n++ {
		proc.WaitFor(t, time.Minute, "the attempt's wait", func() bool {
			return len(buf.records("dead container(s) still look live; asking again")) == n
		})
		h.death(engine.Death{Engine: "docker", ID: id, At: now}) // another report
	}
	proc.WaitFor(t, time.Minute, "the death handled", func() bool { return len(buf.records("container death handled")) == 1 })
	r := buf.records("container death handled")[0]
	if r["reaped"] != float64(1) || r["attempts"] != float64(3) {
		t.Errorf("handled: %v; want reaped after 3 attempts", r)
	}
}

// TestDeathHandlerReportedAgain: a death reported again while its first
// report is being handled (a pidfd, then the engine's event) is handled
// anew when every attempt of the first still found the container live
// (an engine slower to agree than the retries are long), and not when
// the first settled it.
func TestDeathHandlerReportedAgain(t *testing.T) {
	slow, quick := strings.Repeat("b6", 32), strings.Repeat("c7", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, gate: make(chan struct{}), scripts: map[string][]action.Action{
		// Live for the first handling's two attempts, stray after.
		slow:  {action.SkipLive, action.SkipLive, action.Reaped},
		quick: {action.Reaped},
	}}
	h, buf := scriptedHandler(t, sa)

	now := time.Now()
	for _, id := range []string{slow, quick} {
		h.death(engine.Death{Engine: "docker", ID: id, At: now, Via: "pidfd"})
		h.death(engine.Death{Engine: "docker", ID: id, At: now}) // its event, while in flight
	}
	close(sa.gate)
	proc.WaitFor(t, time.Minute, "both reaped", func() bool {
		n := 0
		for _, r := range buf.records("container death handled") {
			if r["reaped"] == float64(1) {
				n++
			}
		}
		return n == 2
	})
	h.close()
	if got := sa.count(slow); got != 3 {
		t.Errorf("the slow container: %d attempts, want 2, then 1 for its second report", got)
	}
	if got := sa.count(quick); got != 1 {
		t.Errorf("the settled container: %d attempts, want 1", got)
	}
	// Two deaths: the slow one's handling that ended still live, then
	// handled anew, is counted once.
	handled := h.handledCount("docker")
	if handled != 2 {
		t.Errorf("deaths handled counted %d, want 2", handled)
	}
}

// TestDeathHandlerLaterDeath: a container's death reported again is
// coalesced only if it is the death just handled: by its time (within
// sameDeathSlack) and, for pidfds, its init. A container restarted and
// dead again within coalesceWindow (docker start, then stop) is handled
// again, whether its second death comes after the first settled or while
// the first is still being handled.
func TestDeathHandlerLaterDeath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		second   func(first engine.Death) engine.Death
		inFlight bool // the second is reported while the first is handled
		attempts int
		// spares: the first attempt spares a tree as younger than the
		// death.
		spares bool
	}{
		{"its event, a moment later", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(300 * time.Millisecond)}
		}, false, 1, false},
		{"a later death", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(sameDeathSlack + time.Second)}
		}, false, 2, false},
		{"the same init's pidfd, late", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(time.Minute), Via: "pidfd", PID: f.PID}
		}, false, 1, false},
		{"another init's pidfd", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(time.Second), Via: "pidfd", PID: f.PID + 1}
		}, false, 2, false},
		{"a later death while the first is handled", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(sameDeathSlack + time.Second)}
		}, true, 2, false},
		{"its event while the first is handled", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(100 * time.Millisecond)}
		}, true, 1, false},
		// A tree spared as younger than the first death: a restarted
		// run's, judged by the later time.
		{"a death a moment later, a tree spared as born after the first", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(700 * time.Millisecond)}
		}, false, 2, true},
		{"a death a moment later while the first is handled, a tree spared", func(f engine.Death) engine.Death {
			return engine.Death{Engine: "docker", ID: f.ID, At: f.At.Add(700 * time.Millisecond)}
		}, true, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strings.Repeat("d8", 32)
			script := []action.Action{action.Reaped}
			if tc.spares {
				script = []action.Action{action.SkipYoung, action.Reaped}
			}
			sa := &scriptedAttempts{calls: map[string]int{}, gate: make(chan struct{}), scripts: map[string][]action.Action{id: script}, diedAt: map[string][]time.Time{}}
			h, buf := scriptedHandler(t, sa)
			first := engine.Death{Engine: "docker", ID: id, At: time.Now().Add(-time.Minute), Via: "pidfd", PID: 4242}
			h.death(first)
			if tc.inFlight {
				proc.WaitFor(t, time.Minute, "the first handling started", func() bool { return sa.busy.Load() == 1 })
				h.death(tc.second(first))
				close(sa.gate)
			} else {
				close(sa.gate)
				proc.WaitFor(t, time.Minute, "the first death handled", func() bool { return len(buf.records("container death handled")) == 1 })
				h.death(tc.second(first))
			}
			// Every handling under way, and any it started anew on its
			// way out (before it was done), ends.
			h.wg.Wait()
			h.close()
			if got := sa.count(id); got != tc.attempts {
				t.Errorf("%d attempts, want %d", got, tc.attempts)
			}
			// The attempt anew is decided by the later report's time.
			if at := sa.diedAt[id]; tc.attempts == 2 && (len(at) != 2 || !at[1].Equal(tc.second(first).At)) {
				t.Errorf("decided by %v; the second by %v", at, tc.second(first).At)
			}
		})
	}
}

// TestDeathHandlerRedoesASparedDeathOnce: a death whose decision spared a
// younger tree is decided once more by a later report's time, not again
// for each report after (dockerd's die, then containerd's exit and
// delete), and is counted once.
func TestDeathHandlerRedoesASparedDeathOnce(t *testing.T) {
	id := strings.Repeat("d9", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, gate: make(chan struct{}), scripts: map[string][]action.Action{id: {action.SkipYoung}}}
	close(sa.gate)
	h, buf := scriptedHandler(t, sa)
	first := engine.Death{Engine: "docker", ID: id, At: time.Now().Add(-time.Minute), Via: "pidfd", PID: 4242}
	for i, after := range []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond} {
		d := first
		if after > 0 {
			d = engine.Death{Engine: "docker", ID: id, At: first.At.Add(after)}
		}
		h.death(d)
		want := min(i+1, 2)
		proc.WaitFor(t, 10*time.Second, "the report handled or coalesced", func() bool {
			return len(buf.records("container death handled")) == want && len(buf.records("container death already being handled or just handled; coalesced")) == i+1-want
		})
	}
	h.wg.Wait()
	h.close()
	if got := sa.count(id); got != 2 {
		t.Errorf("%d attempts, want 2: the first, and one by a later time", got)
	}
	handled := h.handledCount("docker")
	if handled != 1 {
		t.Errorf("deaths handled counted %d, want 1", handled)
	}
}

// TestDeathReapedUnrecordedIsAnError: a death whose reap the ledger could
// not take is no quiet success: its line is an error naming why.
func TestDeathReapedUnrecordedIsAnError(t *testing.T) {
	log, buf := jsonLogger()
	id := strings.Repeat("de", 32)
	var serial sync.Mutex
	w := Watch{}
	w.Reconcile.Apply = true
	h := newDeathHandler(w, log, &serial, t.Context(), t.Context())
	h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
		return Report{Report: reconcile.Report{LivenessKnown: true, Trees: []reconcile.Tree{{ContainerID: id, PGID: 7, Action: action.Reaped}},
			Unrecorded: errors.New("no space left on device")}}, nil, nil
	}
	h.death(engine.Death{Engine: "docker", ID: id, At: time.Now()})
	h.close()
	recs := buf.records("container death handled, but reaped without recording in the ledger: the audit trail of these kills is missing")
	if len(recs) != 1 || recs[0]["level"] != "ERROR" || recs[0]["unrecorded"] != "no space left on device" {
		t.Errorf("records %v; want one error naming why", recs)
	}
}

// TestDeathHandlerStillLiveCountsOnce: a death the engines still call
// live after every attempt (a restarted container) is handled, logged and
// counted once.
func TestDeathHandlerStillLiveCountsOnce(t *testing.T) {
	id := strings.Repeat("e9", 32)
	sa := &scriptedAttempts{calls: map[string]int{}, gate: make(chan struct{}), scripts: map[string][]action.Action{
		id: {action.SkipLive, action.SkipLive},
	}}
	close(sa.gate)
	h, buf := scriptedHandler(t, sa)
	h.death(engine.Death{Engine: "docker", ID: id, At: time.Now(), Via: "pidfd", PID: 4242})
	proc.WaitFor(t, time.Minute, "the death handled", func() bool { return len(buf.records("container death handled")) == 1 })
	h.close()
	handled := h.handledCount("docker")
	if handled != 1 {
		t.Errorf("deaths handled counted %d, want 1", handled)
	}
}
