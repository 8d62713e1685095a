package containerd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// BenchmarkTaskExitEvent measures how long after a task's init exits (the
// exited_at containerd stamps it with) its /tasks/exit reaches a
// subscriber: the part of watch's event-to-reap latency that containerd
// owns. Each iteration runs a container, kills it and waits for the event;
// p50/p95 are reported over the iterations (run with -benchtime=20x or
// more).
func BenchmarkTaskExitEvent(b *testing.B) {
	addr := containerdtest.Address(b)
	c, err := Dial(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := make(chan Event, 64)
	ready := make(chan struct{})
	go c.Subscribe(ctx, []string{"kc-bench"}, ready, func(e Event) {
		if e.Topic == TopicTaskExit {
			evs <- e
		}
	})
	<-ready
	containerdtest.ImportImage(b, addr, "kc-bench")
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		id := testutil.RandomHex(b, 64)
		containerdtest.Run(b, addr, "kc-bench", id, nil, "/bin/sleep", "600")
		b.StartTimer()
		containerdtest.Ctr(b, addr, "kc-bench", "tasks", "kill", "-s", "KILL", id)
		for {
			select {
			case e := <-evs:
				if e.ContainerID != id {
					continue
				}
				lat = append(lat, time.Since(e.At))
			case <-time.After(30 * time.Second):
				b.Fatalf("no exit event for %s", id)
			}
			break
		}
		b.StopTimer()
		containerdtest.Remove(addr, "kc-bench", id)
		b.StartTimer()
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[min(n-1, n*95/100)].Microseconds())/1000, "p95-ms")
	}
}
