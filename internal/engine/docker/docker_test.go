package docker

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

func TestDockerRealEngine(t *testing.T) {
	dt := dockertest.Need(t)
	name := "kc-engine-test-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	running := dt.Run(t, []string{"--name", name})
	paused := dt.Run(t, nil)
	dt.Must(t, "pause", paused)
	exited := dt.Run(t, nil, "/bin/sh", "-c", "exit 0")
	dt.Must(t, "wait", exited)
	created := dt.Must(t, "create", "--network", "none", dt.Image, "/bin/sleep", "100000")
	t.Cleanup(func() { dt.Docker("rm", "-f", created) })

	e, err := New(engine.Config{DockerURL: dt.URL, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, err := e.Live(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]engine.Container{}
	for _, c := range a.Containers {
		states[c.ID] = c
	}
	for _, tc := range []struct {
		id, state string
		live      bool
	}{{running, "running", true}, {paused, "paused", true}, {created, "created", true}, {exited, "exited", false}} {
		c, ok := states[tc.id]
		if !ok || c.State != tc.state || c.Live != tc.live {
			t.Errorf("container %s: got %+v, want state %s live %v", tc.id[:12], c, tc.state, tc.live)
		}
	}
	if a.UID != os.Geteuid() || a.Source != engine.SourceAPI {
		t.Errorf("answer uid %d source %s, want the dockerd's uid %d from api", a.UID, a.Source, os.Geteuid())
	}

	// Asked about some containers: those of them dockerd knows, as the
	// whole list has them, and no other.
	gone := strings.Repeat("0", 64)
	n, ok := e.(engine.Narrower)
	if !ok {
		t.Fatal("the docker engine cannot be asked about some containers")
	}
	some, whole, err := n.LiveOf(t.Context(), []string{running, exited, gone})
	if err != nil || whole {
		t.Fatalf("LiveOf: whole %v, %v", whole, err)
	}
	got := map[string]bool{}
	for _, c := range some.Containers {
		got[c.ID] = c.Live
	}
	if !maps.Equal(got, map[string]bool{running: true, exited: false}) || some.UID != a.UID || some.Source != a.Source || some.Endpoint != a.Endpoint {
		t.Errorf("asked about %s, %s and an unknown one: %+v", running[:12], exited[:12], some)
	}
	// Only about unknown ones (the usual stray): an empty list, not null.
	if none, _, err := n.LiveOf(t.Context(), []string{gone}); err != nil || len(none.Containers) != 0 {
		t.Errorf("asked about an unknown container: %+v, %v", none, err)
	}

	for _, ref := range []string{running, running[:12], name} {
		ms, err := e.Resolve(t.Context(), ref)
		if err != nil || len(ms) != 1 || ms[0].ID != running || ms[0].InitPID != dt.InitPID(t, running) {
			t.Errorf("Resolve(%q) = %+v, %v", ref, ms, err)
		}
	}
	if ms, err := e.Resolve(t.Context(), "no-such-container-kc"); err != nil || len(ms) != 0 {
		t.Errorf("Resolve(missing) = %+v, %v", ms, err)
	}

	t.Run("deaths", func(t *testing.T) {
		victim := dt.Run(t, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		got := make(chan engine.Death, 16)
		done := make(chan error, 1)
		go func() { done <- e.Deaths(ctx, engine.DeathWatch{Death: func(d engine.Death) { got <- d }}) }()
		// The subscription is in place once dockerd has it; a kill before
		// that would be missed, so kill until the event comes.
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		killed := false
		for {
			select {
			case d := <-got:
				if d.ID == victim {
					cancel()
					if err := <-done; err != nil {
						t.Fatalf("Deaths after cancel: %v", err)
					}
					return
				}
			case <-tick.C:
				if !killed {
					dt.Must(t, "kill", victim)
					killed = true
				}
			case <-ctx.Done():
				t.Fatal("no die event for the killed container")
			}
		}
	})
}

func TestDockerBadAnswersAreErrors(t *testing.T) {
	id := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name string
		body string
		code int
		want string
	}{
		{"garbage", "<html>hello</html>", 200, "not the JSON"},
		{"null", "null", 200, "null"},
		{"object", `{"message":"x"}`, 200, "not the JSON"},
		{"short id", `[{"Id":"abc","State":"running"}]`, 200, "no full container ID"},
		{"no state", `[{"Id":"` + id + `"}]`, 200, "unknown state"},
		{"odd state", `[{"Id":"` + id + `","State":"Up 3 minutes"}]`, 200, "unknown state"},
		{"server error", `{"message":"boom"}`, 500, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.code)
				w.Write([]byte(tc.body))
			})
			e, err := New(engine.Config{DockerURL: u, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			_, err = e.Live(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Live() err = %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("an empty list is an answer", func(t *testing.T) {
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[]")) })
		e, _ := New(engine.Config{DockerURL: u})
		a, err := e.Live(t.Context())
		if err != nil || len(a.Containers) != 0 || a.UID != os.Geteuid() {
			t.Fatalf("Live() = %+v, %v", a, err)
		}
	})
}

func TestDockerHungAndUnreachable(t *testing.T) {
	t.Run("hung", func(t *testing.T) {
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		e, _ := New(engine.Config{DockerURL: u, Timeout: 300 * time.Millisecond})
		start := time.Now()
		_, err := e.Live(t.Context())
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want a deadline", err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("took %v", took)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		e, _ := New(engine.Config{DockerURL: "unix://" + filepath.Join(t.TempDir(), "none.sock")})
		if _, err := e.Live(t.Context()); err == nil {
			t.Fatal("no error from a socket that does not exist")
		}
	})
	t.Run("symlinked socket is refused", func(t *testing.T) {
		_, dir := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[]")) })
		link := filepath.Join(dir, "link.sock")
		if err := os.Symlink(filepath.Join(dir, "docker.sock"), link); err != nil {
			t.Fatal(err)
		}
		e, _ := New(engine.Config{DockerURL: "unix://" + link})
		if _, err := e.Live(t.Context()); err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Fatalf("err = %v, want a symlink refusal", err)
		}
	})
}

func TestDockerURL(t *testing.T) {
	for _, tc := range []struct {
		url, env string
		want     string
		bad      bool
	}{
		{"", "", DefaultURL, false},
		{"", "unix:///srv/d.sock", "unix:///srv/d.sock", false},
		{"tcp://127.0.0.1:2375", "unix:///srv/d.sock", "tcp://127.0.0.1:2375", false},
		{"ssh://host", "", "", true},
		{"unix://", "", "", true},
		{"", "npipe:////./pipe/docker", "", true},
	} {
		t.Run(tc.url+"|"+tc.env, func(t *testing.T) {
			t.Setenv("DOCKER_HOST", tc.env)
			e, err := New(engine.Config{DockerURL: tc.url})
			if tc.bad {
				if !errors.Is(err, engine.ErrUsage) {
					t.Fatalf("err = %v, want usage", err)
				}
				return
			}
			if err != nil || e.Endpoint() != tc.want {
				t.Fatalf("got %v, %v; want %s", e, err, tc.want)
			}
		})
	}
}

// TestDockerListCostsItsBytes: a list of entries that are no containers
// (16 MiB of "{},", each a struct once decoded) is refused at the first
// entry, not decoded whole first.
func TestDockerListCostsItsBytes(t *testing.T) {
	body := []byte("[" + strings.Repeat("{},", 16<<20/3-1) + "{}]")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var l dockerList
	err := json.Unmarshal(body, &l)
	runtime.ReadMemStats(&after)
	if le := (*listError)(nil); !errors.As(err, &le) || !strings.Contains(err.Error(), "entry 0 has no full container ID") {
		t.Fatalf("Unmarshal = %v, want entry 0 refused", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 2*uint64(len(body)) {
		t.Errorf("decoding %d bytes allocated %d MiB", len(body), got>>20)
	}
}

// TestDockerTooOldVersion: Docker 29 refuses API versions below 1.44,
// naming its minimum. The client asks again in that version, and from
// then on only in it, for lists and event streams alike; any other 400 is
// an error as before.
func TestDockerTooOldVersion(t *testing.T) {
	id := strings.Repeat("ab", 32)
	var old atomic.Int32
	dockerd29 := func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !strings.HasPrefix(r.URL.Path, "/v1.44/"):
			old.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"message":"client version 1.41 is too old. Minimum supported API version is 1.44, please upgrade your client to a newer version"}`))
		case r.URL.Path == "/v1.44/containers/json":
			w.Write([]byte(`[{"Id":"` + id + `","Names":["/web"],"State":"running"}]`))
		case r.URL.Path == "/v1.44/events":
			w.Write([]byte(`{"Type":"container","Action":"die","Actor":{"ID":"` + id + `"},"timeNano":1}` + "\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}
	t.Run("lists", func(t *testing.T) {
		old.Store(0)
		u, _ := dockertest.Fake(t, dockerd29)
		e, _ := New(engine.Config{DockerURL: u, Timeout: 5 * time.Second})
		for range 2 {
			a, err := e.Live(t.Context())
			if err != nil || a.LiveCount() != 1 || a.Containers[0].ID != id {
				t.Fatalf("Live() = %+v, %v; want %s live", a, err, id)
			}
		}
		if n := old.Load(); n != 1 {
			t.Errorf("asked %d times in a version dockerd refuses, want once", n)
		}
	})
	t.Run("events", func(t *testing.T) {
		old.Store(0)
		u, _ := dockertest.Fake(t, dockerd29)
		e, _ := New(engine.Config{DockerURL: u, Timeout: 5 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		got := make(chan engine.Death, 1)
		done := make(chan error, 1)
		go func() { done <- e.Deaths(ctx, engine.DeathWatch{Death: func(d engine.Death) { got <- d }}) }()
		select {
		case d := <-got:
			if d.ID != id {
				t.Errorf("death of %s, want %s", d.ID, id)
			}
		case err := <-done:
			t.Fatalf("Deaths ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no death reported")
		}
	})
	t.Run("another bad request", func(t *testing.T) {
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"message":"client version 1.41 is too old. Minimum supported API version is 1.41, please upgrade"}`))
		})
		e, _ := New(engine.Config{DockerURL: u, Timeout: 5 * time.Second})
		if _, err := e.Live(t.Context()); err == nil || !strings.Contains(err.Error(), "too old") {
			t.Fatalf("Live() err = %v, want dockerd's refusal", err)
		}
	})
}
