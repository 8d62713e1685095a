package main

import (
	"io"
	"os"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestMain removes the binaries testutil.Build compiled for these tests.
func TestMain(m *testing.M) { testutil.Main(m) }

// TestOneShotCommandsRunWithoutTheCollector: reconcile and status run
// with the garbage collector off (oneshot.Tune); sweep, whose memory other
// users' sockets drive, and every other command keep it.
func TestOneShotCommandsRunWithoutTheCollector(t *testing.T) {
	t.Setenv("GOGC", "") // restored after the test
	os.Unsetenv("GOGC")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	var names []string
	for _, c := range commands(t.TempDir()) {
		if tunedCommand(c.Name) {
			names = append(names, c.Name)
		}
	}
	if !slices.Equal(names, []string{"reconcile", "status"}) {
		t.Errorf("tuned commands %v, want reconcile and status", names)
	}
	for _, tt := range []struct {
		args []string
		gc   int
	}{
		{[]string{"sweep", "--socket-dir", t.TempDir()}, 100},
		{[]string{"status"}, -1},
	} {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		args := append(append([]string{"kc-janitor"}, tt.args...), "--state-dir", t.TempDir())
		if err := runApp(app, args); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if gc := debug.SetGCPercent(100); gc != tt.gc {
			t.Errorf("after %v, GC percent %d, want %d", tt.args, gc, tt.gc)
		}
	}
}
