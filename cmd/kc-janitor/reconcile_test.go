package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestReconcileUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"bad format", []string{"reconcile", "--format", "yaml"}},
		{"bad format before the command", []string{"--format", "yaml", "reconcile"}},
		{"bad log format", []string{"reconcile", "--log-format", "xml"}},
		{"malformed min-age", []string{"reconcile", "--min-age", "soon"}},
		{"negative min-age", []string{"reconcile", "--min-age", "-1s"}},
		{"zero kill-grace", []string{"reconcile", "--kill-grace", "0s"}},
		{"malformed kill-grace", []string{"reconcile", "--kill-grace", "5 s"}},
		{"zero podman-timeout", []string{"reconcile", "--podman-timeout", "0s"}},
		{"zero podman-timeout before the command", []string{"--podman-timeout", "0s", "reconcile"}},
		{"empty podman-arg before the command", []string{"--podman-arg", " ", "reconcile"}},
		{"several arguments in one podman-arg", []string{"reconcile", "--podman-arg", "--root=/nonexistent/a --runroot=/nonexistent/b"}},
		{"short container id", []string{"reconcile", "--container", "abc123"}},
		{"empty supervisor comm", []string{"reconcile", "--supervisor-comm", " , "}},
		{"supervisor comm too long", []string{"reconcile", "--supervisor-comm", "a-name-longer-than-15"}},
		{"malformed apply", []string{"reconcile", "--apply=maybe"}},
		{"unknown flag", []string{"reconcile", "--bogus"}},
		{"empty state dir", []string{"reconcile", "--state-dir", ""}},
		{"relative state dir", []string{"reconcile", "--state-dir", "run/kc-watchman"}},
		{"log file in a missing dir", []string{"reconcile", "--log-file", "/nonexistent/kc/janitor.log"}},
		{"metrics file in a missing dir", []string{"reconcile", "--metrics-file", "/nonexistent/kc/janitor.prom"}},
		{"unknown bpf mode", []string{"reconcile", "--bpf", "yes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runJanitorCapture(t, tt.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; output %q", code, exitUsage, out)
			}
		})
	}
}

// TestReconcileUnreachable: with no podman to ask, nothing is scanned or
// touched, and the exit code says "ground truth unknown".
func TestReconcileUnreachable(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no podman CLI to fall back to
	// Scoped all the same: an --apply run of a test never reaches
	// further than a container of its own.
	own := strings.Repeat("e", 63) + "1"
	for _, args := range [][]string{
		{"reconcile", "--podman-url", "unix:///nonexistent/podman.sock", "--format", "json", "--apply", "--container", own},
		{"--podman-url", "unix:///nonexistent/podman.sock", "--format", "json", "reconcile", "--apply", "--container", own},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out := runJanitorCapture(t, args...)
			if code != exitUnknown {
				t.Fatalf("exit %d, want %d; output %q", code, exitUnknown, out)
			}
			var rep struct {
				LivenessKnown bool  `json:"liveness_known"`
				Trees         []any `json:"trees"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("global --format json not honoured: %v: %q", err, out)
			}
			if rep.LivenessKnown || len(rep.Trees) != 0 {
				t.Errorf("report %+v", rep)
			}
		})
	}
}

// TestFlagBeatsEnvironmentAtEitherPosition: a global flag typed before the
// command wins over its environment variable, as one typed after it does.
func TestFlagBeatsEnvironmentAtEitherPosition(t *testing.T) {
	t.Setenv("KC_FORMAT", "text")
	for _, args := range [][]string{
		{"--format", "json", "reconcile", "--podman-url", "unix:///nonexistent/podman.sock"},
		{"reconcile", "--format", "json", "--podman-url", "unix:///nonexistent/podman.sock"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Setenv("PATH", t.TempDir())
			_, out := runJanitorCapture(t, args...)
			if !json.Valid([]byte(out)) {
				t.Errorf("output is not JSON: %q", out)
			}
		})
	}
}

// TestReconcileApplyVariables: KC_RECONCILE_APPLY, once set, wins over
// KC_APPLY for reconcile as for watch (the README's rollout step).
func TestReconcileApplyVariables(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, tc := range []struct {
		env    []string
		dryRun bool
	}{
		{[]string{"KC_RECONCILE_APPLY=0", "KC_APPLY=1"}, true},
		{[]string{"KC_RECONCILE_APPLY=1", "KC_APPLY=0"}, false},
		{[]string{"KC_APPLY=1"}, false},
		{nil, true},
	} {
		t.Run(strings.Join(tc.env, " "), func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			// Scoped to a container no host has, should an engine answer.
			code, out := runJanitorCapture(t, "reconcile", "--engine", "podman", "--podman-url", "unix:///nonexistent/podman.sock", "--format", "json",
				"--state-dir", filepath.Join(t.TempDir(), "state"), "--container", testutil.RandomHex(t, 64))
			var rep struct {
				DryRun bool `json:"dry_run"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitUnknown {
				t.Fatalf("exit %d, %v: %q", code, err, out)
			}
			if rep.DryRun != tc.dryRun {
				t.Errorf("dry_run %v, want %v", rep.DryRun, tc.dryRun)
			}
		})
	}
}
