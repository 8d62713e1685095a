package main

import (
	"os"
	"strings"
	"testing"
)

// TestGeneratedDocsCurrent: docs/CONFIGURATION.md and docs/man/kc-janitor.8
// are what the flag definitions generate now, so a flag added or changed
// without `make docs` fails here, with the command that fixes it.
func TestGeneratedDocsCurrent(t *testing.T) {
	for _, tc := range []struct {
		path string
		args []string
	}{
		{"../../docs/CONFIGURATION.md", []string{"config-doc"}},
		{"../../docs/man/kc-janitor.8", []string{"man"}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			code, want := runJanitorCapture(t, tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d", code)
			}
			got, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatalf("%v; generate it with: make docs", err)
			}
			if string(got) != want {
				t.Errorf("%s is out of date with the flag definitions; regenerate it with: make docs (then commit it)", strings.TrimPrefix(tc.path, "../../"))
			}
		})
	}
}

// TestHelpListsExitStatus: every command's help ends with its exit codes,
// and an --apply switch shows one default.
func TestHelpListsExitStatus(t *testing.T) {
	for _, cmd := range []string{"reconcile", "sweep", "cull", "doctor", "status", "watch", "version"} {
		t.Run(cmd, func(t *testing.T) {
			code, out := runJanitorCapture(t, cmd, "--help")
			if code != exitOK || !strings.Contains(out, "Exit status:") {
				t.Errorf("exit %d, no exit status in:\n%s", code, out)
			}
			if strings.Contains(out, "(default: dry run) (default: false)") || strings.Contains(out, "dry run) (default") {
				t.Errorf("two defaults:\n%s", out)
			}
		})
	}
	_, out := runJanitorCapture(t, "man")
	for _, want := range []string{"EXIT STATUS", "ENVIRONMENT", "[$KC_MIN_AGE]", `\fBKC_SWEEPER_LOG\fR`, "three gates agree"} {
		if !strings.Contains(out, want) {
			t.Errorf("man page lacks %q", want)
		}
	}
}
