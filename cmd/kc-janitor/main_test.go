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

// TestOneShotCommandsRunWithoutTheCollector: a command that does one job
// runs with the garbage collector off (oneshot.Tune); watch keeps it.
func TestOneShotCommandsRunWithoutTheCollector(t *testing.T) {
	t.Setenv("GOGC", "") // restored after the test
	os.Unsetenv("GOGC")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	var names []string
	for _, c := range commands(t.TempDir()) {
		if longRunning(c.Name) {
			names = append(names, c.Name)
		}
	}
	if !slices.Equal(names, []string{"watch"}) {
		t.Errorf("long-running commands %v, want watch alone", names)
	}
	app := newApp()
	app.Writer = io.Discard
	if err := runApp(app, []string{"kc-janitor", "version", "--state-dir", t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if gc := debug.SetGCPercent(100); gc != -1 {
		t.Errorf("after version, GC percent %d, want -1 (off)", gc)
	}
}
