package dockertest

import (
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// Fake serves h on a unix socket in a temp dir, as an engine API (Docker's
// or podman's) would, and returns its URL and the dir. The server is
// closed at the test's end.
func Fake(t testing.TB, h http.HandlerFunc) (url, dir string) {
	t.Helper()
	dir = t.TempDir()
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + sock, dir
}
