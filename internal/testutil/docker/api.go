package dockertest

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// API serves the two Docker Engine API calls the janitor makes on a
// real unix socket in dir: /containers/json answers list() (a JSON array),
// /events streams whatever is sent on events until the client goes. It
// returns the socket's path; the server is closed at the test's end. For
// what cannot run here on demand (a dockerd that lists a container
// running, then reports its death); the real dockerd's tests cover the
// real thing.
func API(t testing.TB, dir string, list func() string, events <-chan string) string {
	t.Helper()
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/containers/json"):
			w.Write([]byte(list()))
		case strings.HasSuffix(r.URL.Path, "/events"):
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			for {
				select {
				case ev := <-events:
					w.Write([]byte(ev))
					w.(http.Flusher).Flush()
				case <-r.Context().Done():
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}
