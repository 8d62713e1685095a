package engine

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestDeathsSilentEndpointReturns: an engine socket that accepts the
// events request and never answers (a wedged dockerd or podman service)
// must not leave the subscription deaf and silent for the life of watch:
// Deaths should fail within a bound (the engine timeout for the response
// headers), so followDeaths logs the drop and subscribes again.
func TestDeathsSilentEndpointReturns(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	silent := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}
	for _, tc := range []struct {
		name string
		new  func(url string) (Engine, error)
	}{
		{"docker", func(u string) (Engine, error) { return newDocker(Config{DockerURL: u, Timeout: time.Second}) }},
		{"podman", func(u string) (Engine, error) { return newPodman(Config{PodmanURL: u, Timeout: time.Second}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := fakeDocker(t, silent)
			e, err := tc.new(u)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			readyCalled := false
			start := time.Now()
			err = e.Deaths(ctx, DeathWatch{Ready: func() { readyCalled = true }, Death: func(Death) {}})
			if ctx.Err() != nil {
				t.Fatalf("Deaths against a socket that never answers returned only when its context ended (%v, err %v, ready %v): the subscription is deaf and nothing is logged",
					time.Since(start).Round(time.Millisecond), err, readyCalled)
			}
		})
	}
}
