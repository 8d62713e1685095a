package e2e

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// stopContainer stops a real container and waits until nothing local
// says it still runs (DESIGN "Ground truth must be corroborated"): no process of it left in its cgroup
// under its conmon, no recorded init alive.
func stopContainer(t testing.TB, e *podmantest.Env, id string) {
	t.Helper()
	e.Stop(t, id)
	for deadline := time.Now().Add(30 * time.Second); ; {
		ev, running, err := corroborate.New("", nil, nil, "").Running(id, 0)
		if err == nil && !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s stopped but still looks alive after 30s: %v %v", id, ev, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
