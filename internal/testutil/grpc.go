package testutil

import (
	"net"
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
	p := filepath.Join(t.TempDir(), "grpc.sock")
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
