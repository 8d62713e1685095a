package janitor

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// streaming is an engine whose death stream opens and stays open.
type streaming struct {
	engine.Engine
	subscribed atomic.Int32
}

func (*streaming) Name() string     { return "docker" }
func (*streaming) Endpoint() string { return "unix:///run/docker.sock" }
func (s *streaming) Deaths(ctx context.Context, w engine.DeathWatch) error {
	s.subscribed.Add(1)
	w.Ready()
	<-ctx.Done()
	return nil
}

// TestFollowersLookAgain: an engine that appears after watch started
// (dockerd ordered after kc-janitor-watch at boot) is followed from the
// next look and caught up once; one without death events is asked again
// at each look, said at INFO once; a followed engine is not subscribed
// twice.
func TestFollowersLookAgain(t *testing.T) {
	log, buf := jsonLogger()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var serial sync.Mutex
	h := newDeathHandler(Watch{}, slog.New(slog.DiscardHandler), &serial, ctx, ctx)
	var catchUps atomic.Int32
	h.attempt = func(_ context.Context, opt reconcile.Options, _ *slog.Logger) (Report, error, error) {
		if len(opt.Containers) == 0 {
			catchUps.Add(1)
		}
		return Report{Report: reconcile.Report{LivenessKnown: true}}, nil, nil
	}
	docker := &streaming{}
	var looks atomic.Int32
	f := &followers{ctx: ctx, h: h, log: log, on: map[string]bool{}, told: map[string]bool{},
		pick: func() ([]engine.Engine, error) {
			if looks.Add(1) == 1 {
				return []engine.Engine{noEvents{}}, nil // dockerd not up yet
			}
			return []engine.Engine{noEvents{}, docker}, nil
		}}
	f.run(20 * time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for looks.Load() < 5 || catchUps.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after %d looks: docker subscribed %d times, %d catch-ups", looks.Load(), docker.subscribed.Load(), catchUps.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	f.wg.Wait()
	h.close()
	if n := docker.subscribed.Load(); n != 1 {
		t.Errorf("docker subscribed %d times over %d looks, want once", n, looks.Load())
	}
	if n := catchUps.Load(); n != 1 {
		t.Errorf("%d catch-ups, want one for the late engine", n)
	}
	said := buf.records("engine reports no container deaths; its strays wait for the next round")
	info := 0
	for _, r := range said {
		if r["level"] == "INFO" {
			info++
		}
	}
	if len(said) < 4 || info != 1 {
		t.Errorf("no-events engine said %d times (%d at INFO); want one INFO at the first look, then DEBUG at each look", len(said), info)
	}
}
