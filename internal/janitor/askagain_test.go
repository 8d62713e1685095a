package janitor

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestScanThenAskAsksAgain: the engines are asked while the host is
// scanned. An answer that leaves a tree to act on was perhaps given
// before the scan read that tree, so they are asked again and the
// second answer decides: here the container it lists running, which the
// first did not know, keeps its tree. An answer that calls every tree
// live is enough, and so is any answer for a decision on deaths (a tree
// born after the death is spared whatever it says).
func TestScanThenAskAsksAgain(t *testing.T) {
	const comm = "kcsrv-askagain"
	id := testutil.RandomHex(t, 64)
	g, st := startTreeBeforeDeaths(t, comm, id)
	running := fmt.Sprintf(`[{"Id":%q,"Names":["/c"],"State":"running"}]`, id)
	for _, tc := range []struct {
		name    string
		answers []string // the list's answers in turn; the last one after
		died    bool
		asked   int32
		want    action.Action
	}{
		{"the first answer calls it gone", []string{`[]`, running}, false, 2, action.SkipLive},
		{"gone both times", []string{`[]`}, false, 2, action.WouldReap},
		{"the first answer calls it live", []string{running, `[]`}, false, 1, action.SkipLive},
		{"a death", []string{`[]`, running}, true, 1, action.WouldReap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, n, filters := listingDockerd(t, tc.answers...)
			opt := reconcile.Options{Comms: []string{comm}, Containers: map[string]bool{id: true}}
			if tc.died {
				// Ticks after the tree started: the death's rule spares
				// nothing here.
				opt.DiedAt = time.Now()
			}
			s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}, StateDir: t.TempDir(), Reconcile: opt}
			rep, _, liveErr, err := ScanThenAsk(t.Context(), s, false, slog.New(slog.DiscardHandler))
			if err != nil || liveErr != nil {
				t.Fatalf("ScanThenAsk: %v, %v", liveErr, err)
			}
			if got := n.Load(); got != tc.asked {
				t.Errorf("the engine was asked %d times, want %d", got, tc.asked)
			}
			// The first answer listed no other container, to check a
			// narrowed answer with: the whole list is asked again.
			if tc.asked > 1 && filters.Load() != "" {
				t.Errorf("the second question's filters %q, want none", filters.Load())
			}
			if got := actionOf(rep, g.PGID); got != tc.want {
				t.Errorf("tree %d: %q, want %q (%+v)", g.PGID, got, tc.want, rep.Trees)
			}
		})
	}

	// The second question fails: the truth is unknown, nothing touched,
	// even in an apply run.
	t.Run("the second answer fails", func(t *testing.T) {
		var n atomic.Int32
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/containers/json") {
				http.NotFound(w, r)
				return
			}
			if n.Add(1) > 1 {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, `[]`)
		})
		opt := reconcile.Options{Comms: []string{comm}, Containers: map[string]bool{id: true}, Apply: true, KillGrace: 200 * time.Millisecond}
		s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}, StateDir: t.TempDir(), Reconcile: opt}
		_, _, liveErr, err := ScanThenAsk(t.Context(), s, true, slog.New(slog.DiscardHandler))
		if err != nil || !errors.Is(liveErr, engine.ErrUnknown) {
			t.Fatalf("ScanThenAsk: %v, %v; want the truth unknown", liveErr, err)
		}
		if got := n.Load(); got != 2 {
			t.Errorf("the engine was asked %d times, want 2", got)
		}
		if !fingerprint.Alive("/proc", st) {
			t.Error("the tree was signalled on the first answer")
		}
	})
}

// TestScanErrorCancelsTheQuestion: when the scan fails, the question
// asked beside it is cancelled, not waited for: an engine that never
// answers does not hold the run for its whole timeout.
func TestScanErrorCancelsTheQuestion(t *testing.T) {
	asked, cancelled := make(chan struct{}), make(chan struct{})
	u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/containers/json") {
			http.NotFound(w, r)
			return
		}
		close(asked)
		<-r.Context().Done()
		close(cancelled)
	})
	s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u, Timeout: time.Hour}, StateDir: t.TempDir(),
		Reconcile: reconcile.Options{Comms: []string{"kcsrv-noscan"}}}
	s.scan = func(reconcile.Options) (*reconcile.Scanned, error) {
		<-asked
		return nil, errors.New("scanning processes: the test's failure")
	}
	type result struct{ liveErr, err error }
	done := make(chan result, 1)
	go func() {
		_, _, liveErr, err := ScanThenAsk(t.Context(), s, false, slog.New(slog.DiscardHandler))
		done <- result{liveErr, err}
	}()
	select {
	case r := <-done:
		if r.err == nil || r.liveErr != nil {
			t.Fatalf("ScanThenAsk: %v, %v; want the scan's error", r.liveErr, r.err)
		}
		if !strings.Contains(r.err.Error(), "scanning processes") {
			t.Errorf("error %q does not say the scan failed", r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ScanThenAsk waited for a question the failed scan no longer needs")
	}
	select {
	case <-cancelled:
	case <-time.After(time.Minute):
		t.Error("the question was left running")
	}
}

// TestAskedAgainAboutTheDoubtedAlone: the second question names the
// doubted container, and a container the first answer listed as a
// canary; what the answer says of any other container, even one it
// lists as exited now, does not undo the first answer's "live": that
// tree is spared this run, the doubted one judged.
func TestAskedAgainAboutTheDoubtedAlone(t *testing.T) {
	const comm = "kcsrv-askabout"
	live, gone := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	gl := testutil.StartMixedGroup(t, comm, live, live)
	gg := testutil.StartMixedGroup(t, comm, gone, gone)
	// The second answer ignores the filter; the first container stopped
	// meanwhile.
	u, n, filters := listingDockerd(t,
		fmt.Sprintf(`[{"Id":%q,"Names":["/l"],"State":"running"}]`, live),
		fmt.Sprintf(`[{"Id":%q,"Names":["/l"],"State":"exited"}]`, live))
	opt := reconcile.Options{Comms: []string{comm}, Containers: map[string]bool{live: true, gone: true}}
	s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}, StateDir: t.TempDir(), Reconcile: opt}
	rep, _, liveErr, err := ScanThenAsk(t.Context(), s, false, slog.New(slog.DiscardHandler))
	if err != nil || liveErr != nil {
		t.Fatalf("ScanThenAsk: %v, %v", liveErr, err)
	}
	if got := n.Load(); got != 2 {
		t.Errorf("the engine was asked %d times, want 2", got)
	}
	if want := fmt.Sprintf(`{"id":[%q,%q]}`, gone, live); filters.Load() != want {
		t.Errorf("the second question's filters %q, want %q (the doubted, then the canary)", filters.Load(), want)
	}
	want := map[int]action.Action{gl.PGID: action.SkipLive, gg.PGID: action.WouldReap}
	for _, tr := range rep.Trees {
		if a, ok := want[tr.PGID]; ok {
			if tr.Action != a {
				t.Errorf("tree %d of %s: %q, want %q", tr.PGID, tr.ContainerID[:12], tr.Action, a)
			}
			delete(want, tr.PGID)
		}
	}
	if len(want) > 0 {
		t.Errorf("trees not reported: %v (%+v)", want, rep.Trees)
	}
}

// actionOf is what rep did with the tree of group pgid ("" if none).
func actionOf(rep Report, pgid int) action.Action {
	for _, tr := range rep.Trees {
		if tr.PGID == pgid {
			return tr.Action
		}
	}
	return ""
}

// startTreeBeforeDeaths starts a tree of container id and waits until
// /proc's clock is two ticks past its start: a death stamped from then
// on is after it, and the rule that spares a tree born after its death
// spares nothing.
func startTreeBeforeDeaths(t *testing.T, comm, id string) (testutil.MixedGroup, fingerprint.Stat) {
	t.Helper()
	g := testutil.StartMixedGroup(t, comm, id, id)
	st, err := fingerprint.ReadStat("/proc", g.PGID)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.WaitTickPast("/proc", st.StartTicks+2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return g, st
}

// listingDockerd is a dockerd whose container lists answer answers in
// turn, the last one from then on; asked counts the lists, filters is
// the second list's filters parameter.
func listingDockerd(t *testing.T, answers ...string) (url string, asked *atomic.Int32, filters *atomic.Value) {
	t.Helper()
	asked, filters = new(atomic.Int32), new(atomic.Value)
	url, _ = dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/containers/json") {
			http.NotFound(w, r)
			return
		}
		k := int(asked.Add(1)) - 1
		if k == 1 {
			filters.Store(r.URL.Query().Get("filters"))
		}
		fmt.Fprint(w, answers[min(k, len(answers)-1)])
	})
	return url, asked, filters
}
