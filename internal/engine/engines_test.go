package engine_test

// The tests that hold every HTTP engine (Docker's and podman's clients) to
// the same rule: they live outside package engine, which imports none of
// its engines.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/docker"
	"github.com/kc-watchman/kc-watchman/internal/engine/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// peakRSS resets this process's peak resident set size (clear_refs 5)
// and returns a function reading it, in bytes.
func peakRSS(t *testing.T) func() int64 {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak RSS: %v", err)
	}
	return func() int64 {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmHWM in /proc/self/status")
		return 0
	}
}

// TestEventMessageCap: Docker's /events and libpod's event stream, served
// on a real unix socket, send a 10 MiB message, then a death, then a
// message that never ends. The death after the big message is reported,
// the big one is counted, the endless one is read and thrown away as it
// comes (the stream is not dropped: a re-subscription would replay it)
// and counted when the stream ends in it,
// and this process stays far below 300 MB however much of it is sent.
func TestEventMessageCap(t *testing.T) {
	id := strings.Repeat("cd", 32)
	const endless = 1 << 30 // what the server sends of the endless message before the test stops it
	for _, eng := range []struct {
		name, path, action string
		new                func(url string) engine.Engine
	}{
		{"docker", "/events", "die", func(u string) engine.Engine { e, _ := docker.New(engine.Config{DockerURL: u}); return e }},
		{"podman", "/libpod/events", "died", func(u string) engine.Engine { e, _ := podman.New(engine.Config{PodmanURL: u}); return e }},
	} {
		t.Run(eng.name, func(t *testing.T) {
			var sent atomic.Int64
			u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, eng.path) {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(http.StatusOK)
				chunk := bytes.Repeat([]byte("a"), 64<<10) // inside a JSON string, no newline: one message goes on
				write := func(b []byte) bool {
					n, err := w.Write(b)
					sent.Add(int64(n))
					return err == nil
				}
				write([]byte(`{"Type":"container","Action":"` + eng.action + `","Actor":{"ID":"`))
				for i := 0; i < 10<<20/len(chunk)+1; i++ {
					write(chunk)
				}
				write([]byte("\"}}\n"))
				write([]byte(fmt.Sprintf(`{"Type":"container","Action":%q,"timeNano":%d,"Actor":{"ID":%q}}`+"\n", eng.action, time.Now().UnixNano(), id)))
				write([]byte(`{"Type":"container","Action":"` + eng.action + `","Actor":{"ID":"`))
				for sent.Load() < endless && write(chunk) {
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			peak := peakRSS(t)
			e := eng.new(u)
			var deaths, tooLarge, tooLargeBefore atomic.Int32
			sctx, stop := context.WithCancel(t.Context())
			defer stop()
			done := make(chan error, 1)
			go func() {
				done <- e.Deaths(sctx, engine.DeathWatch{
					Death: func(d engine.Death) {
						if d.ID == id {
							deaths.Add(1)
							tooLargeBefore.Store(tooLarge.Load())
						}
					},
					Skipped: func(reason string, size int64) {
						if reason == engine.SkipTooLarge {
							tooLarge.Add(1)
						}
					},
				})
			}()
			deadline := time.Now().Add(2 * time.Minute)
			for sent.Load() < endless || deaths.Load() == 0 {
				select {
				case err := <-done:
					t.Fatalf("the stream ended after %d MiB: %v", sent.Load()>>20, err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 2 minutes: %d MiB sent, %d deaths", sent.Load()>>20, deaths.Load())
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Errorf("Deaths after cancel: %v", err)
			}
			p := peak()
			t.Logf("%d MiB sent (a 10 MiB message, a death, an endless message): peak RSS %d MiB", sent.Load()>>20, p>>20)
			// The endless message is counted too once the stream ends in it.
			if deaths.Load() != 1 || tooLargeBefore.Load() != 1 || tooLarge.Load() != 2 {
				t.Errorf("%d deaths, %d messages counted too large before it and %d in all, want 1, 1 and 2", deaths.Load(), tooLargeBefore.Load(), tooLarge.Load())
			}
			if p > 300<<20 {
				t.Errorf("peak RSS %d MiB reading the stream, want < 300 MiB", p>>20)
			}
		})
	}
}

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
		new  func(url string) (engine.Engine, error)
	}{
		{"docker", func(u string) (engine.Engine, error) {
			return docker.New(engine.Config{DockerURL: u, Timeout: time.Second})
		}},
		{"podman", func(u string) (engine.Engine, error) {
			return podman.New(engine.Config{PodmanURL: u, Timeout: time.Second})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := dockertest.Fake(t, silent)
			e, err := tc.new(u)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			readyCalled := false
			start := time.Now()
			err = e.Deaths(ctx, engine.DeathWatch{Ready: func() { readyCalled = true }, Death: func(engine.Death) {}})
			if ctx.Err() != nil {
				t.Fatalf("Deaths against a socket that never answers returned only when its context ended (%v, err %v, ready %v): the subscription is deaf and nothing is logged",
					time.Since(start).Round(time.Millisecond), err, readyCalled)
			}
		})
	}
}
