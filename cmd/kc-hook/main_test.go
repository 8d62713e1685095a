package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func runHook(t *testing.T, stdin string, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	code := run(append([]string{"kc-hook"}, args...), strings.NewReader(stdin), &stderr)
	return code, stderr.String()
}

// TestBadInputWritesNothing: every unusable input exits 2 with one line on
// stderr and leaves no file anywhere.
func TestBadInputWritesNothing(t *testing.T) {
	tests := []struct {
		name  string
		stdin string
		args  []string
	}{
		{"not json", "garbage", []string{"poststop"}},
		{"no id", `{"status":"stopped"}`, []string{"poststop"}},
		{"traversal id", `{"id":"../../../tmp/x"}`, []string{"createRuntime"}},
		{"huge input", strings.Repeat("x", 10<<20), []string{"poststop"}},
		{"unknown stage", `{"id":"` + cid + `"}`, []string{"prestop"}},
		{"no stage", `{"id":"` + cid + `"}`, nil},
		{"two stages", `{"id":"` + cid + `"}`, []string{"poststop", "poststart"}},
		{"bad kill grace", `{"id":"` + cid + `"}`, []string{"--kill-grace", "-1s", "poststop"}},
		{"malformed kill grace", `{"id":"` + cid + `"}`, []string{"--kill-grace", "soon", "poststop"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			args := append([]string{"--state-dir", state}, tt.args...)
			code, stderr := runHook(t, tt.stdin, args...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d", code, exitBadInput)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n"); stderr == "" || (lines > 0 && !strings.Contains(stderr, "USAGE")) {
				t.Errorf("stderr is not one clear line: %q", stderr)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("state dir was created for bad input: %v", err)
			}
		})
	}
}

// TestCreateRuntimeNeverFails: a bookkeeping failure must not stop the
// container from starting.
func TestCreateRuntimeNeverFails(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The state dir lies under a regular file: nothing can be written.
	state := filepath.Join(blocker, "state")
	code, stderr := runHook(t, `{"id":"`+cid+`","pid":`+itoa(os.Getpid())+`}`, "--state-dir", state, "createRuntime")
	if code != exitOK {
		t.Errorf("exit %d, want 0; stderr %q", code, stderr)
	}
	if !strings.Contains(stderr, "bookkeeping failed") {
		t.Errorf("the failure was not logged: %q", stderr)
	}
}

func TestRecordsAndPoststopWithNoTrees(t *testing.T) {
	state := t.TempDir()
	code, stderr := runHook(t, `{"id":"`+cid+`","pid":`+itoa(os.Getpid())+`}`, "--state-dir", state, "prestart")
	if code != exitOK {
		t.Fatalf("prestart: exit %d: %s", code, stderr)
	}
	code, stderr = runHook(t, `{"id":"`+cid+`","status":"stopped"}`, "--state-dir", state, "poststop")
	if code != exitOK {
		t.Fatalf("poststop: exit %d: %s", code, stderr)
	}
	data, err := os.ReadFile(filepath.Join(state, "containers", cid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"createRuntime"`, `"poststop"`, `"outcome": "nothing"`, `"pid": ` + itoa(os.Getpid())} {
		if !strings.Contains(string(data), want) {
			t.Errorf("record lacks %s:\n%s", want, data)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "kc-hook.log")); err != nil {
		t.Errorf("no log: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
