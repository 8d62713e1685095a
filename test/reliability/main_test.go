//go:build reliability

// Package reliability is kc-watchman's reliability and security suite:
// it tries, many times over, to make kc-hook and kc-janitor
// signal the wrong process or unlink the wrong file, and injects faults
// (podman unreachable, hooks killed mid-run, a stop storm, a reboot, a
// full or read-only state dir, hostile input), and reports what it tried,
// how often, and what was lost.
//
// It runs only with the build tag "reliability" (make reliability):
//
//	go test -tags reliability -count=1 ./test/reliability/
//
// Every figure is logged as one line
//
//	FIGURE {"area":"...","name":"...","value":...}
//
// and, when KC_RELIABILITY_REPORT names a file, written there as JSON lines
// (docs/RELIABILITY.md is filled from that file).
//
// Hygiene: other packages' tests run fake supervisor trees in parallel, so
// every tree here has a supervisor comm of its own ("kcrel-…"), every
// janitor run is scoped with --container, and every process is killed by
// PID only after its start time was checked (or while it is an unreaped
// child). Waiting always polls a condition.
package reliability

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// reportEnv names the file the figures are written to.
const reportEnv = "KC_RELIABILITY_REPORT"

// figure is one number the suite measured.
type figure struct {
	Area  string `json:"area"`
	Name  string `json:"name"`
	Value any    `json:"value"`
}

var (
	figMu   sync.Mutex
	figures []figure
)

// report records a figure and logs it in the parseable form.
func report(t testing.TB, area, name string, value any) {
	t.Helper()
	f := figure{Area: area, Name: name, Value: value}
	line, err := json.Marshal(f)
	if err != nil {
		t.Fatalf("figure %s/%s: %v", area, name, err)
	}
	t.Logf("FIGURE %s", line)
	figMu.Lock()
	figures = append(figures, f)
	figMu.Unlock()
}

func writeReport(path string) error {
	figMu.Lock()
	defer figMu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, fig := range figures {
		if err := enc.Encode(fig); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func TestMain(m *testing.M) {
	proc.Main() // helper processes (bystanders) never return from here
	code := m.Run()
	if path := os.Getenv(reportEnv); path != "" && !inPIDNS() {
		if err := writeReport(path); err != nil {
			fmt.Fprintf(os.Stderr, "writing %s: %v\n", path, err)
			code = 1
		}
	}
	cleanupBinaries()
	testutil.RemoveBuilds() // the fake kcserver of the sweep attack
	os.Exit(code)
}
