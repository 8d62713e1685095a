package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// runJanitorCapture runs kc-janitor with args as run() does, capturing
// stdout, and returns the exit code.
func runJanitorCapture(t *testing.T, args ...string) (int, string) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := runApp(app, append([]string{"kc-janitor"}, args...))
	code := exitOK
	if err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		} else {
			code = exitUsage
		}
		t.Logf("kc-janitor %s: %v", strings.Join(args, " "), err)
	}
	return code, out.String()
}

// orphanSock leaves a socket file with nothing listening at dir/name.
func orphanSock(t *testing.T, dir, name string) string { return testutil.OrphanSocket(t, dir, name) }

// goneSockName is kc-<pid>.sock for a PID whose process has exited.
func goneSockName(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("kc-%d.sock", cmd.Process.Pid)
}

func decodeSweep(t *testing.T, out string) map[string]map[string]any {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if got := sortedKeys(raw); !reflect.DeepEqual(got, []string{"dirs", "dry_run", "sockets"}) {
		t.Errorf("top-level keys %v", got)
	}
	if _, ok := raw["dry_run"].(bool); !ok {
		t.Errorf("dry_run %v", raw["dry_run"])
	}
	list, ok := raw["sockets"].([]any)
	if !ok {
		t.Fatalf("sockets %v", raw["sockets"])
	}
	want := []string{"action", "error", "kind", "path", "pid", "reason", "verdict"}
	byPath := map[string]map[string]any{}
	for _, e := range list {
		m := e.(map[string]any)
		if got := sortedKeys(m); !reflect.DeepEqual(got, want) {
			t.Errorf("socket keys %v, want %v", got, want)
		}
		byPath[m["path"].(string)] = m
	}
	return byPath
}

func sortedKeys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	sort.Strings(k)
	return k
}

func TestSweepCLI(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantDryRun bool
	}{
		{"dry run by default", []string{"sweep", "--format", "json"}, nil, true},
		{"global flag before the command", []string{"--format", "json", "sweep"}, nil, true},
		{"--apply", []string{"sweep", "--apply", "--format=json"}, nil, false},
		{"KC_SWEEP=1", []string{"sweep", "--format", "json"}, map[string]string{"KC_SWEEP": "1"}, false},
		{"KC_APPLY=1", []string{"sweep", "--format", "json"}, map[string]string{"KC_APPLY": "1"}, false},
		{"KC_SWEEP=0", []string{"sweep", "--format", "json"}, map[string]string{"KC_SWEEP": "0"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			dir := t.TempDir()
			k := testutil.StartKCServer(t, dir, testutil.Fake{})
			stale := orphanSock(t, dir, goneSockName(t))
			code, out := runJanitorCapture(t, append(tt.args, "--socket-dir", dir, "--timeout", "300ms")...)
			if code != exitOK {
				t.Fatalf("exit %d\n%s", code, out)
			}
			got := decodeSweep(t, out)
			if len(got) != 2 {
				t.Fatalf("%d sockets: %s", len(got), out)
			}
			live, st := got[k.Socket], got[stale]
			if live["verdict"] != "live" || live["action"] != "kept" || live["kind"] != "control" ||
				int(live["pid"].(float64)) != k.PID || live["error"] != nil {
				t.Errorf("live: %v", live)
			}
			wantAction := "unlinked"
			if tt.wantDryRun {
				wantAction = "would-unlink"
			}
			if st["verdict"] != "stale" || st["action"] != wantAction || st["error"] != nil {
				t.Errorf("stale: %v", st)
			}
			if _, err := os.Lstat(stale); (err == nil) != tt.wantDryRun {
				t.Errorf("stale socket exists: %v, dry run %v", err == nil, tt.wantDryRun)
			}
		})
	}
}

func TestSweepCLIText(t *testing.T) {
	dir := t.TempDir()
	stale := orphanSock(t, dir, goneSockName(t))
	logFile := filepath.Join(t.TempDir(), "sweeper.log")
	t.Setenv("KC_SWEEPER_LOG", logFile)
	code, out := runJanitorCapture(t, "sweep", "--socket-dir", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	if !strings.Contains(out, "[DRY-RUN] would unlink "+stale) {
		t.Errorf("output lacks the dry-run line:\n%s", out)
	}
	data, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(data), stale) {
		t.Errorf("KC_SWEEPER_LOG: %v %q", err, data)
	}
}

func TestSweepCLIExitCodes(t *testing.T) {
	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{
			{"sweep", "--format", "xml"},
			{"sweep", "--no-such-flag"},
			{"sweep", "--workers", "0"},
			{"sweep", "--hashed-min-age", "0"},
			{"sweep", "--hashed-min-age", "-1m"},
		} {
			if code, out := runJanitorCapture(t, args...); code != exitUsage {
				t.Errorf("%v: exit %d, want %d: %s", args, code, exitUsage, out)
			}
		}
	})
	t.Run("missing explicit dir", func(t *testing.T) {
		if code, _ := runJanitorCapture(t, "sweep", "--socket-dir", filepath.Join(t.TempDir(), "nope")); code != exitFailed {
			t.Errorf("exit %d, want %d", code, exitFailed)
		}
	})
	t.Run("unlink fails on a read-only mount", func(t *testing.T) {
		src := t.TempDir()
		stale := filepath.Base(orphanSock(t, src, goneSockName(t)))
		ro := t.TempDir()
		if err := unix.Mount(src, ro, "", unix.MS_BIND, ""); err != nil {
			t.Skipf("bind mount: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
		if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			t.Skipf("remount read-only: %v", err)
		}
		code, out := runJanitorCapture(t, "sweep", "--apply", "--format", "json", "--socket-dir", ro, "--timeout", "300ms")
		if code != exitFailed {
			t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
		}
		s := decodeSweep(t, out)[filepath.Join(ro, stale)]
		if s == nil || s["action"] != "failed" || s["error"] == nil {
			t.Errorf("%v", s)
		}
		if _, err := os.Lstat(filepath.Join(src, stale)); err != nil {
			t.Errorf("socket gone: %v", err)
		}
	})
}

// TestSweepCLIHashed runs sweep on a dead socket with Kallichore's hashed
// name, kc-<hex>.sock. It was created just now, so only a minimum age
// below its real age (1ns) lets it be stale; the default (2m) keeps it.
func TestSweepCLIHashed(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		env       map[string]string
		wantStale bool
	}{
		{"default minimum age keeps a fresh one", []string{"--apply"}, nil, false},
		{"--hashed-min-age 1ns dry run", []string{"--hashed-min-age", "1ns"}, nil, true},
		{"--hashed-min-age 1ns --apply", []string{"--apply", "--hashed-min-age=1ns"}, nil, true},
		{"KC_SWEEP_HASHED_MIN_AGE=1ns", []string{"--apply"}, map[string]string{"KC_SWEEP_HASHED_MIN_AGE": "1ns"}, true},
		{"the flag beats the environment", []string{"--apply", "--hashed-min-age", "1h"}, map[string]string{"KC_SWEEP_HASHED_MIN_AGE": "1ns"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			dir := t.TempDir()
			p := orphanSock(t, dir, "kc-3fa9c2d17b604e81.sock")
			args := append([]string{"sweep", "--format", "json", "--socket-dir", dir, "--timeout", "300ms"}, tt.args...)
			code, out := runJanitorCapture(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d\n%s", code, out)
			}
			s := decodeSweep(t, out)[p]
			if s == nil {
				t.Fatalf("not reported:\n%s", out)
			}
			if s["kind"] != "session" || s["pid"] != float64(0) || s["error"] != nil ||
				!strings.HasPrefix(s["reason"].(string), "hashed name: no PID") {
				t.Errorf("%v", s)
			}
			apply := slices.Contains(tt.args, "--apply")
			wantVerdict, wantAction := "unknown", "kept"
			switch {
			case tt.wantStale && apply:
				wantVerdict, wantAction = "stale", "unlinked"
			case tt.wantStale:
				wantVerdict, wantAction = "stale", "would-unlink"
			}
			if s["verdict"] != wantVerdict || s["action"] != wantAction {
				t.Errorf("verdict %v action %v (%v), want %s %s", s["verdict"], s["action"], s["reason"], wantVerdict, wantAction)
			}
			if !tt.wantStale && !strings.Contains(s["reason"].(string), "minimum age") {
				t.Errorf("reason %q does not name the minimum age", s["reason"])
			}
			if _, err := os.Lstat(p); (err == nil) != (wantAction != "unlinked") {
				t.Errorf("exists %v after %s", err == nil, wantAction)
			}
		})
	}

	t.Run("text", func(t *testing.T) {
		dir := t.TempDir()
		p := orphanSock(t, dir, "kc-3fa9c2d17b604e81.sock")
		code, out := runJanitorCapture(t, "sweep", "--socket-dir", dir, "--hashed-min-age", "1ns")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, out)
		}
		if want := "[DRY-RUN] would unlink " + p + " (session, hashed name, no pid): hashed name: no PID to check; connect refused"; !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	})

	t.Run("help", func(t *testing.T) {
		_, out := runJanitorCapture(t, "sweep", "--help")
		for _, want := range []string{"--hashed-min-age", "KC_SWEEP_HASHED_MIN_AGE", "2m0s", "kc-<hex>.sock"} {
			if !strings.Contains(out, want) {
				t.Errorf("sweep --help lacks %q", want)
			}
		}
	})
}

// TestEmptyContainerIsNoHost: a --container or KC_CONTAINER that is set
// but empty (an unset variable in a cron line) is a usage error, never a
// run over the whole host's sockets.
func TestEmptyContainerIsNoHost(t *testing.T) {
	dir := t.TempDir()
	stale := orphanSock(t, dir, goneSockName(t))
	for _, tc := range []struct {
		name string
		env  bool
		args []string
	}{
		{"flag", false, []string{"sweep", "--apply", "--container", "", "--socket-dir", dir}},
		{"variable", true, []string{"sweep", "--apply", "--socket-dir", dir}},
		{"cull, variable", true, []string{"cull", "--socket-dir", dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env {
				t.Setenv("KC_CONTAINER", "")
			}
			if code, out := runJanitorCapture(t, tc.args...); code != exitUsage {
				t.Errorf("exit %d, want %d; output %q", code, exitUsage, out)
			}
			if !testutil.PathExists(stale) {
				t.Fatal("the host's orphan was unlinked")
			}
		})
	}
}

// TestSweepContainerPIDGone: --container-pid (KC_CONTAINER_PID) naming no
// process is refused before anything is looked up through it (exit 1).
func TestSweepContainerPIDGone(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runJanitor(t, []string{"KC_CONTAINER_PID=" + strconv.Itoa(gone.Process.Pid)}, "sweep", "--socket-dir", t.TempDir())
	if code != exitFailed || !strings.Contains(stderr, "no such process") {
		t.Errorf("exit %d, want %d and no such process:\n%s", code, exitFailed, stderr)
	}
}
