package podman

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// followPodman runs e.Deaths in the background and returns the deaths it
// reports, a channel closed on Ready, and a stop that cancels it and
// returns Deaths' error.
func followPodman(t *testing.T, e engine.Engine, since time.Time) (<-chan engine.Death, <-chan struct{}, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	deaths := make(chan engine.Death, 64)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.Deaths(ctx, engine.DeathWatch{Since: since, Ready: func() { close(ready) }, Death: func(d engine.Death) { deaths <- d }})
	}()
	stop := func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("Deaths did not return 10s after its context was cancelled")
		}
	}
	t.Cleanup(func() { stop() })
	return deaths, ready, stop
}

// waitDeath waits for the death of id, failing on a death reported for
// any container of notDead.
func waitDeath(t *testing.T, deaths <-chan engine.Death, id string, notDead ...string) engine.Death {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case d := <-deaths:
			for _, n := range notDead {
				if d.ID == n {
					t.Fatalf("death reported for %s, which is running", n[:12])
				}
			}
			if d.ID == id {
				return d
			}
		case <-timeout:
			t.Fatalf("no death reported for %s within 30s", id[:12])
		}
	}
}

// TestPodmanDeaths follows a real podman's "died" events, through its API
// service and, without one, through `podman events`: a container killed,
// one removed with rm -f, one killed before the subscription (replayed
// from Since), and none for a running container.
func TestPodmanDeaths(t *testing.T) {
	pm := podmantest.New(t)
	url := pm.StartAPI(t)
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"api", engine.Config{PodmanURL: url, PodmanArgs: pm.GlobalArgs()}},
		{"cli without a service", engine.Config{PodmanURL: "unix://" + filepath.Join(t.TempDir(), "none.sock"),
			PodmanArgs: pm.GlobalArgs(), PodmanBin: pm.PodmanPath()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Timeout = 10 * time.Second
			e, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			running, killed, removed, before := pm.Run(t), pm.Run(t), pm.Run(t), pm.Run(t)
			since := time.Now()
			if _, err := pm.Podman("kill", before); err != nil {
				t.Fatal(err)
			}
			deaths, ready, stop := followPodman(t, e, since)
			select {
			case <-ready:
			case <-time.After(30 * time.Second):
				t.Fatal("Ready not called within 30s")
			}
			if d := waitDeath(t, deaths, before, running); d.Engine != "podman" || d.At.Before(since) {
				t.Errorf("death before the subscription: %+v, want podman's, at or after %v", d, since)
			}
			start := time.Now()
			if _, err := pm.Podman("kill", killed); err != nil {
				t.Fatal(err)
			}
			if d := waitDeath(t, deaths, killed, running); d.At.Before(start.Add(-time.Second)) {
				t.Errorf("kill: death at %v, before the kill at %v", d.At, start)
			}
			if _, err := pm.Podman("rm", "-f", "-t", "0", removed); err != nil {
				t.Fatal(err)
			}
			waitDeath(t, deaths, removed, running)
			if err := stop(); err != nil {
				t.Errorf("Deaths after cancel: %v", err)
			}
			if st := pm.State(t, running); st != "running" {
				t.Errorf("the running container is %s", st)
			}
		})
	}
}

// TestPodmanDeathsStream reads what a service sends: deaths of full IDs
// only, other events passed over, garbage passed over and counted (a
// stream replayed from the last event would bring it back forever), an
// end of stream an error, and no service at all ErrNoEvents until a
// stream was once open. libpod ends every message with a newline (its
// json.Encoder), as the bodies here do.
func TestPodmanDeathsStream(t *testing.T) {
	id := strings.Repeat("ab", 32)
	event := func(action, id string) string {
		return fmt.Sprintf(`{"status":%[1]q,"id":%[2]q,"Type":"container","Action":%[1]q,"Actor":{"ID":%[2]q},"timeNano":1796177118728478786}`, action, id)
	}
	serve := func(body string) string {
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != podmanEventsPath || r.URL.Query().Get("filters") != podmanDeathFilter {
				http.Error(w, `{"message":"not the request podman expects"}`, http.StatusBadRequest)
				return
			}
			w.Write([]byte(body))
		})
		return u
	}
	for _, tc := range []struct {
		name, body string
		want       []string
		err        string
		malformed  int
	}{
		{"died of a full ID", event("died", id) + "\n", []string{id}, "stream ended", 0},
		{"other events and short IDs skipped", event("cleanup", id) + "\n" + event("kill", id) + "\n" + event("died", id[:12]) + "\n" + event("died", id), []string{id}, "stream ended", 0},
		{"garbage passed over", "<html>\n" + event("died", id) + "\n<html>", []string{id}, "stream ended", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := New(engine.Config{PodmanURL: serve(tc.body)})
			var got []string
			malformed := 0
			err := e.Deaths(t.Context(), engine.DeathWatch{Death: func(d engine.Death) {
				got = append(got, d.ID)
				if d.Engine != "podman" || d.At.UnixNano() != 1796177118728478786 {
					t.Errorf("death %+v, want podman's with the event's time", d)
				}
			}, Skipped: func(reason string, _ int64) {
				if reason == engine.SkipMalformed {
					malformed++
				}
			}})
			if malformed != tc.malformed {
				t.Errorf("%d malformed messages counted, want %d", malformed, tc.malformed)
			}
			if err == nil || errors.Is(err, engine.ErrNoEvents) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err = %v, want a dropped stream (%s)", err, tc.err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("deaths %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("refused request is an error", func(t *testing.T) {
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"message":"no such thing"}`, http.StatusInternalServerError)
		})
		e, _ := New(engine.Config{PodmanURL: u})
		err := e.Deaths(t.Context(), engine.DeathWatch{Ready: func() { t.Error("Ready called for a refused request") }, Death: func(engine.Death) {}})
		if err == nil || errors.Is(err, engine.ErrNoEvents) || !strings.Contains(err.Error(), "no such thing") {
			t.Errorf("err = %v, want the service's refusal", err)
		}
	})

	t.Run("no service, then one that went away", func(t *testing.T) {
		dir := t.TempDir()
		sock := filepath.Join(dir, "podman.sock")
		e, _ := New(engine.Config{PodmanURL: "unix://" + sock})
		if err := e.Deaths(t.Context(), engine.DeathWatch{Death: func(engine.Death) {}}); !errors.Is(err, engine.ErrNoEvents) {
			t.Fatalf("no socket: err = %v, want ErrNoEvents", err)
		}
		e.(*podman).subscribed.Store(true)
		if err := e.Deaths(t.Context(), engine.DeathWatch{Death: func(engine.Death) {}}); err == nil || errors.Is(err, engine.ErrNoEvents) {
			t.Fatalf("socket gone after a stream: err = %v, want an error to retry on", err)
		}
	})

	t.Run("symlinked socket is refused", func(t *testing.T) {
		u := serve(event("died", id))
		link := filepath.Join(t.TempDir(), "link.sock")
		if err := os.Symlink(strings.TrimPrefix(u, "unix://"), link); err != nil {
			t.Fatal(err)
		}
		e, _ := New(engine.Config{PodmanURL: "unix://" + link})
		err := e.Deaths(t.Context(), engine.DeathWatch{Death: func(d engine.Death) { t.Errorf("death %+v through a symlink", d) }})
		if err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("err = %v, want a symlink refusal", err)
		}
	})

	t.Run("podman events", func(t *testing.T) {
		script := func(body string) string {
			p := filepath.Join(t.TempDir(), "podman")
			if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}
		line := fmt.Sprintf(`{"ID":%q,"Status":"died","Time":"2026-12-02T02:05:18.728478786Z","Type":"container"}`, id)
		for _, tc := range []struct {
			name, bin, err string
			deaths         int
			noEvents       bool
		}{
			{"garbage passed over", script("echo nonsense; echo '" + line + "'; echo '{\"ID\":\"ab\",\"Status\":\"died\",\"Type\":\"container\"}'; exit 1"), "stream ended", 1, false},
			{"the CLI fails", script("echo 'Error: no store here' >&2; exit 125"), "no store here", 0, false},
			{"no CLI", filepath.Join(t.TempDir(), "no-podman"), "no podman CLI", 0, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e, _ := New(engine.Config{PodmanURL: "unix://" + filepath.Join(t.TempDir(), "none.sock"), PodmanArgs: []string{}, PodmanBin: tc.bin})
				n := 0
				err := e.Deaths(t.Context(), engine.DeathWatch{Death: func(d engine.Death) {
					n++
					if d.ID != id || d.At.UnixNano() != 1796177118728478786 {
						t.Errorf("death %+v, want %s at the line's time", d, id[:12])
					}
				}})
				if err == nil || errors.Is(err, engine.ErrNoEvents) != tc.noEvents || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("err = %v, want %q (ErrNoEvents: %v)", err, tc.err, tc.noEvents)
				}
				if n != tc.deaths {
					t.Errorf("%d deaths, want %d", n, tc.deaths)
				}
			})
		}
	})

	t.Run("a service of another store", func(t *testing.T) {
		// --podman-arg names a store the service does not serve: its
		// deaths are another podman's, and the CLI's (with the store's
		// arguments) are followed instead, as for the list.
		other := strings.Repeat("cd", 32)
		u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case libpodAPI + "/info":
				w.Write([]byte(`{"store":{"graphRoot":"/var/lib/containers/storage","runRoot":"/run/containers/storage"}}`))
			case podmanEventsPath:
				w.Write([]byte(event("died", other) + "\n"))
			default:
				http.NotFound(w, r)
			}
		})
		bin := filepath.Join(t.TempDir(), "podman")
		line := fmt.Sprintf(`{"ID":%q,"Status":"died","Time":"2026-12-02T02:05:18.728478786Z","Type":"container"}`, id)
		if err := os.WriteFile(bin, []byte("#!/bin/sh\necho '"+line+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		e, _ := New(engine.Config{PodmanURL: u, PodmanArgs: []string{"--root", root, "--runroot", root + "/run"}, PodmanBin: bin})
		var got []string
		e.Deaths(t.Context(), engine.DeathWatch{Death: func(d engine.Death) { got = append(got, d.ID) }})
		if fmt.Sprint(got) != fmt.Sprint([]string{id}) {
			t.Errorf("deaths %v, want the CLI's %s (not the other store's %s)", got, id[:12], other[:12])
		}
	})
}
