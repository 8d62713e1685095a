package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestRoundThatCannotLookDropsItsCounts: a watch round that cannot find
// the containers to sweep sweeps and audits nothing; the sweep's and
// cull's counts of the round before are taken out of the metrics file,
// not left to be read as current, and cull's run is not a success.
func TestRoundThatCannotLookDropsItsCounts(t *testing.T) {
	w, file := orphanWatch(t)
	var lookErr error
	w.SocketTargets = func(context.Context) ([]sweep.Target, error) { return []sweep.Target{{}}, lookErr }
	read := func() string {
		t.Helper()
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	w.Once(t.Context(), slog.New(slog.DiscardHandler))
	if got := read(); !strings.Contains(got, metrics.SocketsStale+" 1") || !strings.Contains(got, metrics.RunSuccess+`{command="cull"} 1`) {
		t.Fatalf("first round's metrics lack the stale socket or cull's success:\n%s", got)
	}
	// Its container not found; then found but gone before its sweep.
	stopped := exec.Command("true")
	if err := stopped.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		targets []sweep.Target
		err     error
	}{
		{"not found", nil, errors.New("the container could not be resolved")},
		{"gone before its sweep", []sweep.Target{{InitPID: stopped.Process.Pid}}, nil},
		{"the sweep crashed", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookErr = nil
			w.SocketTargets = func(context.Context) ([]sweep.Target, error) { return []sweep.Target{{}}, nil }
			w.Once(t.Context(), slog.New(slog.DiscardHandler))
			if got := read(); !strings.Contains(got, metrics.SocketsStale+" 1") {
				t.Fatalf("a round that looked lacks the stale socket:\n%s", got)
			}
			w.SocketTargets = func(context.Context) ([]sweep.Target, error) {
				if tc.targets == nil && tc.err == nil {
					panic("a bug in the sweep")
				}
				return tc.targets, tc.err
			}
			w.Once(t.Context(), slog.New(slog.DiscardHandler))
			got := read()
			for _, gone := range []string{metrics.SocketsStale, metrics.Supervisors + " ", metrics.SessionsAbandoned + " "} {
				if strings.Contains(got, gone) {
					t.Errorf("%s still in the file after a round that could not look:\n%s", gone, got)
				}
			}
			if !strings.Contains(got, metrics.RunSuccess+`{command="cull"} 0`) {
				t.Errorf("cull's run not failed:\n%s", got)
			}
		})
	}
}

// TestRoundSweepsTheContainersItCanLookInto: a watch scoped to several
// containers, one of which cannot be looked into (stopped, its engine not
// answering), still sweeps and audits the others; the round fails.
func TestRoundSweepsTheContainersItCanLookInto(t *testing.T) {
	w, file := orphanWatch(t)
	// The host stands for the container that could be resolved.
	w.SocketTargets = func(context.Context) ([]sweep.Target, error) {
		return []sweep.Target{{}}, errors.New("container b is not running")
	}
	if code := w.Once(t.Context(), slog.New(slog.DiscardHandler)); code != ExitFailed {
		t.Errorf("round exit %d, want %d", code, ExitFailed)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(data); !strings.Contains(got, metrics.SocketsStale+" 1") || !strings.Contains(got, metrics.RunSuccess+`{command="cull"} 1`) {
		t.Errorf("the resolved container was not swept and audited:\n%s", got)
	}
}

// orphanWatch is a watch with cull whose sweep looks into a directory
// holding one orphan socket (a stale count of 1), writing its metrics to
// file.
func orphanWatch(t *testing.T) (w Watch, file string) {
	t.Helper()
	dir := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	testutil.OrphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", gone.Process.Pid))
	file = filepath.Join(t.TempDir(), "kc.prom")
	w = Watch{CullOn: true, MetricsFile: file}
	w.Sockets = sweep.Config{Dirs: []string{dir}, DialTimeout: 200 * time.Millisecond, Timeout: 500 * time.Millisecond, Pause: 50 * time.Millisecond}
	return w, file
}

// TestRecordSweepSums: a round's sweeps of several containers are
// counted together, not the last one's alone.
func TestRecordSweepSums(t *testing.T) {
	failed := &sweep.Report{Sockets: []*sweep.Socket{{Verdict: sweep.VerdictStale, Action: sweep.ActionFailed}}}
	clean := &sweep.Report{Sockets: []*sweep.Socket{{Verdict: sweep.VerdictLive}}}
	ms := metrics.New()
	RecordSweep(ms, failed, clean)
	file := filepath.Join(t.TempDir(), "kc.prom")
	if err := metrics.WriteFile(file, ms); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(file)
	for _, want := range []string{metrics.SocketsFailed + " 1", metrics.SocketsStale + " 1", metrics.Sockets + `{verdict="live"} 1`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("%q not in\n%s", want, data)
		}
	}
}
