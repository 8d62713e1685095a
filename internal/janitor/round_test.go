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

// TestWatchLoopStopsBeforeARound: once stopping is closed no round
// starts, the first included (a SIGTERM while watch was starting), nor
// one due at once after a round longer than the interval.
func TestWatchLoopStopsBeforeARound(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stopAfter closes stopping during that round (0: before the
		// loop starts).
		stopAfter int32
		want      int32
	}{
		{"stopped while starting", 0, 0},
		{"stopped during a round longer than the interval", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			stopping := make(chan struct{})
			if tc.stopAfter == 0 {
				close(stopping)
			}
			round := func(context.Context) int {
				if n.Add(1) == tc.stopAfter {
					close(stopping)
					time.Sleep(20 * time.Millisecond) // longer than the interval: the next is due at once
				}
				return ExitOK
			}
			done := make(chan struct{})
			go func() {
				loop(context.Background(), stopping, time.Millisecond, round, slog.New(slog.DiscardHandler))
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the loop did not stop")
			}
			if got := n.Load(); got != tc.want {
				t.Errorf("%d rounds, want %d", got, tc.want)
			}
		})
	}
}

// TestWatchLoopInterval: rounds start an interval apart, not an interval
// after the previous round ended. The wait is checked as a computation;
// the real loop is only checked never to start a round early, since a
// loaded machine may start it late.
func TestWatchLoopInterval(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tt := range []struct {
		name    string
		elapsed time.Duration
		want    time.Duration
	}{
		{"short round", 60 * time.Millisecond, 40 * time.Millisecond},
		{"instant round", 0, 100 * time.Millisecond},
		{"round as long as the interval", 100 * time.Millisecond, 0},
		{"round longer than the interval", 250 * time.Millisecond, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := untilNext(t0, t0.Add(tt.elapsed), 100*time.Millisecond); got != tt.want {
				t.Errorf("wait %v, want %v", got, tt.want)
			}
		})
	}

	var starts []time.Time
	stopping := make(chan struct{})
	round := func(context.Context) int {
		starts = append(starts, time.Now())
		if len(starts) == 3 {
			close(stopping)
		}
		return ExitOK
	}
	loop(context.Background(), stopping, 100*time.Millisecond, round, slog.New(slog.DiscardHandler))
	if len(starts) != 3 {
		t.Fatalf("%d rounds", len(starts))
	}
	// starts are stamped inside round, a moment after loop takes its own
	// start: a round preempted there looks up to that moment closer to the
	// next. Rounds run back to back would be microseconds apart.
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d < 80*time.Millisecond {
			t.Errorf("round %d started %v after the previous one, before the interval", i+1, d)
		}
	}
}
