package e2e

import (
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/podmantest"
)

// stopContainer stops a real container and waits until its conmon has
// exited too: conmon lingers a moment after the stop (it runs podman's
// cleanup), and while it lives the janitor rightly takes the container
// for running (DESIGN "Ground truth must be corroborated") and spares its trees as skipped-contradicted.
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
