package testutil

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
)

// ServeGRPC serves the services register adds on a Unix socket in a
// directory of the test's own, until the test ends, and returns the
// socket's path: a fake daemon for what a real one cannot be made to
// answer.
func ServeGRPC(t testing.TB, register func(*grpc.Server)) string {
	t.Helper()
	// Not t.TempDir: it holds the test's name, and a socket's path must
	// fit in 108 bytes.
	dir, err := os.MkdirTemp("", "grpc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "s")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return p
}
