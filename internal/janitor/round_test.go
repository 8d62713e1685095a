package janitor

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/metrics"
)

// TestWatchLoopSurvivesFailedRounds: rounds that fail or crash do not end
// the loop; closing stopping does, after the current round.
func TestWatchLoopSurvivesFailedRounds(t *testing.T) {
	var n atomic.Int32
	stopping := make(chan struct{})
	ms := metrics.New()
	round := func(ctx context.Context) int {
		switch n.Add(1) {
		case 1:
			return ExitUnknown // podman unreachable
		case 2:
			return step(slog.New(slog.DiscardHandler), ms, "reconcile", func() int { panic("boom") })
		case 3:
			return ExitOK
		default:
			close(stopping)
			return ExitOK
		}
	}
	done := make(chan struct{})
	go func() {
		loop(context.Background(), stopping, 10*time.Millisecond, round, slog.New(slog.DiscardHandler))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop")
	}
	if got := n.Load(); got != 4 {
		t.Errorf("%d rounds, want 4", got)
	}
	fams, _ := ms.Gather()
	found := false
	for _, f := range fams {
		if f.GetName() == metrics.RunSuccess {
			found = f.Metric[0].GetGauge().GetValue() == 0
		}
	}
	if !found {
		t.Error("a crashed step was not recorded as a failed run")
	}
}

// TestWatchLoopInterval: rounds start an interval apart, not an interval
// after the previous round ended.
func TestWatchLoopInterval(t *testing.T) {
	var starts []time.Time
	stopping := make(chan struct{})
	round := func(context.Context) int {
		starts = append(starts, time.Now())
		time.Sleep(60 * time.Millisecond)
		if len(starts) == 3 {
			close(stopping)
		}
		return ExitOK
	}
	loop(context.Background(), stopping, 100*time.Millisecond, round, slog.New(slog.DiscardHandler))
	if len(starts) != 3 {
		t.Fatalf("%d rounds", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d < 90*time.Millisecond || d > 150*time.Millisecond {
			t.Errorf("round %d started %v after the previous one, want ~100ms", i+1, d)
		}
	}
}
