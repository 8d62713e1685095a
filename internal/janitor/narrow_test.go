package janitor

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	dockertest "github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestDeathAsksAboutItsContainers: where watch holds an earlier answer,
// a decision on deaths asks the engines about the dead containers alone
// (and a canary the earlier answer listed), not for their whole lists;
// without one, and for any decision that is not on deaths, the whole
// list is asked, and so it is when the earlier answer names an engine
// not found now.
func TestDeathAsksAboutItsContainers(t *testing.T) {
	const comm = "kcsrv-narrow"
	dead, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	g, _ := startTreeBeforeDeaths(t, comm, dead)
	var (
		mu      sync.Mutex
		filters []string
	)
	// dockerd as it answers once the container is dead: exited, and
	// the other one running.
	u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/containers/json") {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		filters = append(filters, r.URL.Query().Get("filters"))
		mu.Unlock()
		fmt.Fprintf(w, `[{"Id":%q,"Names":["/d"],"State":"exited"},{"Id":%q,"Names":["/o"],"State":"running"}]`, dead, other)
	})
	base := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}}
	earlier, err := base.Ask(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := earlier
	elsewhere.Answers = append([]engine.Answer{{Engine: "podman"}}, earlier.Answers...)
	whole, narrowed := "", fmt.Sprintf(`{"id":[%q,%q]}`, dead, other)
	for _, tc := range []struct {
		name   string
		before *engine.Truth
		died   bool
		want   []string // each question's filters, in turn
	}{
		{"a death, with an earlier answer", &earlier, true, []string{narrowed}},
		{"a death, without", nil, true, []string{whole}},
		{"a death, the earlier answer naming an engine not found now", &elsewhere, true, []string{whole}},
		{"a round", &earlier, false, []string{whole, narrowed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			filters = nil
			mu.Unlock()
			opt := reconcile.Options{Comms: []string{comm}, Containers: map[string]bool{dead: true}}
			if tc.died {
				opt.DiedAt = time.Now()
			}
			s := base
			s.StateDir, s.Reconcile = t.TempDir(), opt
			if tc.before != nil {
				s.before = func() (engine.Truth, bool) { return *tc.before, true }
			}
			rep, _, liveErr, err := ScanThenAsk(t.Context(), s, false, slog.New(slog.DiscardHandler))
			if err != nil || liveErr != nil {
				t.Fatalf("ScanThenAsk: %v, %v", liveErr, err)
			}
			mu.Lock()
			got := filters
			mu.Unlock()
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("questions' filters %q, want %q", got, tc.want)
			}
			if a := actionOf(rep, g.PGID); a != action.WouldReap {
				t.Errorf("tree %d: %q, want %q (%+v)", g.PGID, a, action.WouldReap, rep.Trees)
			}
		})
	}
}

// TestLatestTruthKeepsTheNewest: a decision narrowed from an earlier
// answer may end after a relist; its answer, asked at the earlier time,
// does not take the relist's place. One of the same time (narrowed from
// it) does: it is newer for the containers it asked about.
func TestLatestTruthKeepsTheNewest(t *testing.T) {
	t0 := time.Now()
	truth := func(asked time.Time, name string) engine.Truth {
		return engine.Truth{Asked: asked, Answers: []engine.Answer{{Engine: name}}}
	}
	var l latestTruth
	if _, ok := l.get(); ok {
		t.Fatal("an answer before any was given")
	}
	for _, step := range []struct {
		set  engine.Truth
		want string
	}{
		{truth(t0, "first"), "first"},
		{truth(t0.Add(time.Second), "relist"), "relist"},
		{truth(t0, "narrowed from the first"), "relist"},
		{truth(t0.Add(time.Second), "narrowed from the relist"), "narrowed from the relist"},
	} {
		l.set(step.set)
		if got, _ := l.get(); got.Answers[0].Engine != step.want {
			t.Errorf("after %q: %q, want %q", step.set.Answers[0].Engine, got.Answers[0].Engine, step.want)
		}
	}
}
