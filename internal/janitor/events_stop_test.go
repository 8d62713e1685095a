package janitor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// TestDeathHandlerStopDoesNotRunQueuedDeaths: watch's first SIGTERM lets
// the handling under way finish. Deaths still queued behind the serial
// lock (a mass teardown) make no attempt after it: no scan, no question,
// no reap once the operator asked watch to stop, and stopping takes one
// attempt's time, not one per queued death.
func TestDeathHandlerStopDoesNotRunQueuedDeaths(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	var serial sync.Mutex
	stopCtx, stop := context.WithCancel(t.Context())
	h := newDeathHandler(Watch{}, log, &serial, t.Context(), stopCtx)
	var calls, afterStop atomic.Int32
	var stopped atomic.Bool
	started := make(chan struct{}, 64)
	h.attempt = func(context.Context, reconcile.Options, *slog.Logger) (Report, error, error) {
		calls.Add(1)
		if stopped.Load() {
			afterStop.Add(1)
		}
		started <- struct{}{}
		time.Sleep(100 * time.Millisecond) // a scan and an engine question
		return Report{Report: reconcile.Report{LivenessKnown: true}}, nil, nil
	}
	const n = 30
	for i := range n {
		h.death(engine.Death{Engine: "docker", ID: strings.Repeat(fmt.Sprintf("%02x", i), 32), At: time.Now()})
	}
	<-started
	stopped.Store(true)
	stop() // what startDeathEvents' stop does first
	t0 := time.Now()
	h.close()
	if took := time.Since(t0); afterStop.Load() > 1 || took > time.Second {
		t.Errorf("after stop: %d attempts started (want at most the one under way + 0), close took %v", afterStop.Load(), took.Round(time.Millisecond))
	}
}
