package janitor

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestRunWithoutTheLedger: a state dir the janitor cannot use (a file, a
// path through one) is said once, as a warning, and the run goes on; one
// that does not exist yet is no news (no hook has run) and is created.
// doctor's look leaves it to its state-dir check.
func TestRunWithoutTheLedger(t *testing.T) {
	u, _ := dockertest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/containers/json") {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `[]`)
	})
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stateDir string
		look           bool // doctor's: it says so in its own check
		warnings       int
		created        bool
	}{
		{"a file", file, false, 1, false},
		{"under a file", filepath.Join(file, "state"), false, 1, false},
		{"doctor's look at a file", file, true, 0, false},
		{"not there yet", filepath.Join(dir, "new"), false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			s := Settings{Engines: []string{"docker"}, Engine: engine.Config{DockerURL: u}, StateDir: tc.stateDir,
				// A container of no tree on this host: nothing is decided.
				Reconcile: reconcile.Options{Containers: map[string]bool{strings.Repeat("e", 64): true}}}
			_, _, liveErr, err := ScanThenAsk(t.Context(), s, !tc.look, log)
			if err != nil || liveErr != nil {
				t.Fatalf("ScanThenAsk: %v, %v", liveErr, err)
			}
			if n := strings.Count(logs.String(), "running without the ledger"); n != tc.warnings {
				t.Errorf("%d warnings, want %d:\n%s", n, tc.warnings, logs.String())
			}
			if st, err := os.Stat(tc.stateDir); tc.created && (err != nil || !st.IsDir()) {
				t.Errorf("the state dir was not created: %v", err)
			}
		})
	}
}
