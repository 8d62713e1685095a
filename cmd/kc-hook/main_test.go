package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/hook"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// withEnv makes env the whole environment kc-hook's options see, so that
// a KC_* variable of whoever runs the tests cannot change their outcome.
func withEnv(t *testing.T, env map[string]string) {
	t.Helper()
	old := lookupEnv
	lookupEnv = func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
	t.Cleanup(func() { lookupEnv = old })
}

func runHook(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"kc-hook"}, args...), strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// isOneLine reports whether s is exactly one newline-terminated line.
func isOneLine(s string) bool {
	return strings.Count(s, "\n") == 1 && strings.HasSuffix(s, "\n")
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
		{"traversal id", `{"id":"../../../tmp/x"}`, []string{"poststop"}},
		{"huge input", strings.Repeat("x", 10<<20), []string{"poststop"}},
		{"unknown stage", `{"id":"` + cid + `"}`, []string{"prestop"}},
		{"no stage", `{"id":"` + cid + `"}`, nil},
		{"two stages", `{"id":"` + cid + `"}`, []string{"poststop", "poststart"}},
		{"bad kill grace", `{"id":"` + cid + `"}`, []string{"--kill-grace", "-1s", "poststop"}},
		{"malformed kill grace", `{"id":"` + cid + `"}`, []string{"--kill-grace", "soon", "poststop"}},
		{"unknown bpf mode", `{"id":"` + cid + `"}`, []string{"--bpf", "yes", "poststop"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEnv(t, nil)
			state := filepath.Join(t.TempDir(), "state")
			args := append([]string{"--state-dir", state}, tt.args...)
			code, _, stderr := runHook(t, tt.stdin, args...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d", code, exitBadInput)
			}
			if !isOneLine(stderr) || !strings.HasPrefix(stderr, "kc-hook: ") {
				t.Errorf("stderr is not one clear line: %q", stderr)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("state dir was created for bad input: %v", err)
			}
		})
	}
}

// TestPreStartBadInputNeverFails: every pre-start stage exits 0 on input
// it cannot use, says so on stderr, and writes no state; only poststop
// may fail (the runtime fails a container's start on a non-zero exit).
func TestPreStartBadInputNeverFails(t *testing.T) {
	inputs := []struct{ name, stdin string }{
		{"non-hex id", `{"id":"my-container","pid":1,"status":"creating"}`},
		{"short hex id", `{"id":"abc123","pid":1}`},
		{"traversal id", `{"id":"../../../tmp/x"}`},
		{"garbage json", "{not json"},
		{"empty stdin", ""},
		{"no id", `{"status":"created","pid":1}`},
	}
	stages := []string{"createRuntime", "createContainer", "startContainer", "poststart", "prestart", "poststop"}
	for _, stage := range stages {
		for _, in := range inputs {
			t.Run(stage+"/"+in.name, func(t *testing.T) {
				withEnv(t, nil)
				trace := withTrace(t)
				state := filepath.Join(t.TempDir(), "state")
				code, _, stderr := runHook(t, in.stdin, "--state-dir", state, stage)
				want := exitOK
				if stage == "poststop" {
					want = exitBadInput
				}
				if code != want {
					t.Errorf("exit %d, want %d (stderr %q)", code, want, stderr)
				}
				if !isOneLine(stderr) || !strings.HasPrefix(stderr, "kc-hook: ") {
					t.Errorf("stderr is not one clear line: %q", stderr)
				}
				if _, err := os.Stat(state); !os.IsNotExist(err) {
					t.Errorf("state dir was created for bad input: %v", err)
				}
				if _, err := os.Stat(trace); (err == nil) != (stage != "poststop") {
					t.Errorf("trace file: %v", err)
				}
			})
		}
	}
}

// TestPreStartBadSettingsNeverFail: options or variables the hook cannot
// use fail poststop (exit 2) but never a container's start: a pre-start
// stage says so on stderr and in the trace, writes no state, exits 0.
func TestPreStartBadSettingsNeverFail(t *testing.T) {
	settings := []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"malformed kill grace", map[string]string{"KC_KILL_GRACE": "soon"}, nil},
		{"zero deadline", map[string]string{"KC_HOOK_DEADLINE": "0s"}, nil},
		{"relative state dir", map[string]string{"KC_STATE_DIR": "rel"}, nil},
		{"unknown bpf mode", map[string]string{"KC_BPF": "yes"}, nil},
		{"unknown log level", map[string]string{"KC_LOG_LEVEL": "verbose"}, nil},
		{"comm over 15 bytes", map[string]string{"KC_SUPERVISOR_COMM": "a-very-long-supervisor"}, nil},
		{"unknown flag", nil, []string{"--nope"}},
		{"flag after the stage", nil, []string{"STAGE", "--kill-grace=1s"}},
		// A templated value left empty: the option takes the stage name.
		{"option missing its value", nil, []string{"--supervisors-file", "STAGE"}},
	}
	for _, stage := range []string{"createRuntime", "prestart", "createContainer", "startContainer", "poststart", "poststop"} {
		for _, tt := range settings {
			t.Run(stage+"/"+tt.name, func(t *testing.T) {
				env := map[string]string{"KC_STATE_DIR": filepath.Join(t.TempDir(), "state")}
				maps.Copy(env, tt.env)
				withEnv(t, env)
				trace := withTrace(t)
				args := slices.Clone(tt.args)
				if i := slices.Index(args, "STAGE"); i >= 0 {
					args[i] = stage
				} else {
					args = append(args, stage)
				}
				code, _, stderr := runHook(t, `{"id":"`+cid+`","pid":1,"status":"creating"}`, args...)
				want := exitOK
				if stage == "poststop" {
					want = exitBadInput
				}
				if code != want {
					t.Errorf("exit %d, want %d (stderr %q)", code, want, stderr)
				}
				if !isOneLine(stderr) || !strings.HasPrefix(stderr, "kc-hook: ") || (want == exitOK) != strings.HasSuffix(stderr, "the container starts anyway\n") {
					t.Errorf("stderr is not one clear line: %q", stderr)
				}
				if filepath.IsAbs(env["KC_STATE_DIR"]) {
					if _, err := os.Stat(env["KC_STATE_DIR"]); !os.IsNotExist(err) {
						t.Errorf("state dir was created: %v", err)
					}
				}
				data, err := os.ReadFile(trace)
				if (err == nil) != (want == exitOK) || (err == nil && !strings.Contains(string(data), tracedStage(stage))) {
					t.Errorf("trace file: %q, %v", data, err)
				}
			})
		}
	}
}

// TestCheckSettings: --check-settings judges what a stage would be run
// with and says so in one line on stdout, for every stage alike; it
// reads no State, creates no state dir and leaves no trace.
func TestCheckSettings(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want string // "" for ok, else in the refusal
	}{
		{"defaults", nil, []string{"poststop"}, ""},
		{"pre-start stage", nil, []string{"createRuntime"}, ""},
		{"flags", nil, []string{"--kill-grace=2s", "--bpf", "off", "prestart"}, ""},
		{"malformed kill grace", map[string]string{"KC_KILL_GRACE": "soon"}, []string{"createRuntime"}, `"soon" for $KC_KILL_GRACE`},
		{"relative state dir", map[string]string{"KC_STATE_DIR": "rel"}, []string{"poststop"}, "absolute path"},
		{"unknown bpf mode", map[string]string{"KC_BPF": "yes"}, []string{"poststart"}, "--bpf"},
		{"comm over 15 bytes", nil, []string{"--supervisor-comm=a-very-long-supervisor", "poststop"}, "15 bytes"},
		{"unknown flag", nil, []string{"--nope", "poststop"}, "-nope"},
		{"misspelt stage", nil, []string{"postpone"}, `unknown stage "postpone"`},
		{"no stage", nil, nil, "want one STAGE"},
		{"help", nil, []string{"--help", "poststop"}, "--help"},
		{"supervise", nil, []string{"supervise"}, "not a hook stage"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			env := map[string]string{"KC_STATE_DIR": state}
			maps.Copy(env, tt.env)
			withEnv(t, env)
			trace := withTrace(t)
			code, stdout, stderr := runHook(t, "not read", append([]string{"--check-settings"}, tt.args...)...)
			switch {
			case tt.want == "" && (code != exitOK || stdout != "kc-hook: settings ok\n"):
				t.Errorf("exit %d, stdout %q; want 0 and settings ok", code, stdout)
			case tt.want != "" && (code != exitBadInput || !isOneLine(stdout) || !strings.HasPrefix(stdout, "kc-hook: settings refused: ") || !strings.Contains(stdout, tt.want)):
				t.Errorf("exit %d, stdout %q; want 2 and a refusal naming %q", code, stdout, tt.want)
			}
			if stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
			for _, f := range []string{state, trace} {
				if _, err := os.Lstat(f); !os.IsNotExist(err) {
					t.Errorf("%s exists after a check: %v", f, err)
				}
			}
		})
	}
}

// tracedStage is the name a stage is traced under.
func tracedStage(s string) string {
	if s == "prestart" {
		return "createRuntime"
	}
	return s
}

// withTrace points the hook's trace at a file in a temp dir and returns it.
func withTrace(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kc-hook.trace")
	old := traceFiles
	traceFiles = func(int) []string { return []string{p} }
	t.Cleanup(func() { traceFiles = old })
	return p
}

// TestStagesGiveUpPastTheirDeadline: a stage held by what --deadline
// does not reach (here a State never written) gives up before the
// runtime's timeout would end it: a pre-start stage at the deadline with
// exit 0 and a line in the trace (a failed hook would fail the start),
// poststop soon after it with exit 1.
func TestStagesGiveUpPastTheirDeadline(t *testing.T) {
	for _, tc := range []struct {
		stage, says string
		code        int
		traced      bool
	}{
		{"createRuntime", "the container starts anyway", exitOK, true},
		{"poststop", "kc-janitor reconcile will retry", exitFailed, false},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			withEnv(t, nil)
			trace := withTrace(t)
			held, _ := io.Pipe() // never written, never closed
			var out, errb bytes.Buffer
			start := time.Now()
			code := run([]string{"kc-hook", "--state-dir", filepath.Join(t.TempDir(), "state"), "--deadline", "300ms", tc.stage}, held, &out, &errb)
			if took := time.Since(start); code != tc.code || took > 10*time.Second {
				t.Errorf("exit %d after %v, want %d soon after the 300ms deadline", code, took, tc.code)
			}
			if !strings.Contains(errb.String(), tc.says) {
				t.Errorf("stderr %q does not say %q", errb.String(), tc.says)
			}
			b, err := os.ReadFile(trace)
			if traced := err == nil && strings.Contains(string(b), "--deadline"); traced != tc.traced {
				t.Errorf("trace: %q, %v; want a line: %v", b, err, tc.traced)
			}
		})
	}
}

// TestCreateRuntimeNeverFails: a bookkeeping failure must not stop the
// container from starting.
func TestCreateRuntimeNeverFails(t *testing.T) {
	withTrace(t)
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The state dir lies under a regular file: nothing can be written.
	state := filepath.Join(blocker, "state")
	code, _, stderr := runHook(t, `{"id":"`+cid+`","pid":`+itoa(os.Getpid())+`}`, "--state-dir", state, "createRuntime")
	if code != exitOK {
		t.Errorf("exit %d, want 0; stderr %q", code, stderr)
	}
	if !strings.Contains(stderr, "bookkeeping failed") {
		t.Errorf("the failure was not logged: %q", stderr)
	}
}

func TestRecordsAndPoststopWithNoTrees(t *testing.T) {
	state := t.TempDir()
	code, _, stderr := runHook(t, `{"id":"`+cid+`","pid":`+itoa(os.Getpid())+`}`, "--state-dir", state, "prestart")
	if code != exitOK {
		t.Fatalf("prestart: exit %d: %s", code, stderr)
	}
	code, _, stderr = runHook(t, `{"id":"`+cid+`","status":"stopped"}`, "--state-dir", state, "poststop")
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

// TestParseCommandLine: each option comes from its flag, else from its
// environment variable, else from its default; parsing stops at STAGE.
func TestParseCommandLine(t *testing.T) {
	defaults := settings{
		stateDir:        "/run/kc-watchman",
		supervisorComm:  "kcserver",
		killGrace:       5 * time.Second,
		deadline:        20 * time.Second,
		logLevel:        "info",
		supervisorsFile: supervise.DefaultAllowlistFile,
		bpf:             "auto",
	}
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    func(*settings) // edits defaults into the expected settings
		rest    []string
		help    bool
		version bool
		wantErr string // a substring of the error; "" for none
	}{
		{name: "defaults", args: []string{"poststop"}, rest: []string{"poststop"}},
		{
			name: "environment over defaults",
			env: map[string]string{
				"KC_STATE_DIR": "/e", "KC_SUPERVISOR_COMM": "a,b", "KC_KILL_GRACE": "2s",
				"KC_HOOK_DEADLINE": "3s", "KC_HOOK_LOG": "/e/log", "KC_SUPERVISORS_FILE": "/e/s.json",
				"KC_BPF": "off",
			},
			args: []string{"poststop"},
			want: func(s *settings) {
				*s = settings{stateDir: "/e", supervisorComm: "a,b", killGrace: 2 * time.Second,
					deadline: 3 * time.Second, logFile: "/e/log", supervisorsFile: "/e/s.json", bpf: "off", logLevel: "info"}
			},
			rest: []string{"poststop"},
		},
		{
			name: "flags over environment",
			env:  map[string]string{"KC_STATE_DIR": "/e", "KC_KILL_GRACE": "2s", "KC_HOOK_LOG": "/e/log", "KC_BPF": "off"},
			args: []string{"--state-dir=/f", "--kill-grace", "7s", "-log-file", "/f/log", "--deadline=1m", "--bpf=on", "createRuntime"},
			want: func(s *settings) {
				s.stateDir, s.killGrace, s.logFile, s.deadline, s.bpf = "/f", 7*time.Second, "/f/log", time.Minute, "on"
			},
			rest: []string{"createRuntime"},
		},
		{
			name: "empty variable sets a string, not a duration",
			env:  map[string]string{"KC_STATE_DIR": "", "KC_SUPERVISOR_COMM": "", "KC_KILL_GRACE": "", "KC_HOOK_DEADLINE": ""},
			args: []string{"poststop"},
			want: func(s *settings) { s.stateDir, s.supervisorComm = "", "" },
			rest: []string{"poststop"},
		},
		{name: "last flag wins", args: []string{"--state-dir=/a", "--state-dir=/b", "poststop"}, want: func(s *settings) { s.stateDir = "/b" }, rest: []string{"poststop"}},
		{name: "double dash ends the flags", args: []string{"--", "--state-dir=/x"}, rest: []string{"--state-dir=/x"}},
		{name: "flags after the stage are arguments", args: []string{"poststop", "--state-dir", "/x"}, rest: []string{"poststop", "--state-dir", "/x"}},
		{name: "supervise and its flags are left alone", args: []string{"--kill-grace=1s", "supervise", "--nope", "-h"}, want: func(s *settings) { s.killGrace = time.Second }, rest: []string{"supervise", "--nope", "-h"}},
		{name: "no stage", args: nil},
		{name: "help", args: []string{"--help"}, help: true},
		{name: "short help", args: []string{"-h", "poststop"}, help: true},
		{name: "help twice", args: []string{"-h", "--help"}, help: true},
		{name: "help after the stage", args: []string{"poststop", "-help"}, help: true, rest: []string{"poststop", "-help"}},
		{name: "help after a double dash is an argument", args: []string{"poststop", "--", "--help"}, rest: []string{"poststop", "--", "--help"}},
		{name: "help before supervise is the hook's", args: []string{"--help", "supervise"}, help: true},
		{name: "version", args: []string{"--version"}, version: true},
		{name: "short version", args: []string{"-v", "poststop"}, version: true, rest: []string{"poststop"}},
		{name: "unknown flag", args: []string{"--nope", "poststop"}, wantErr: "unknown flag --nope"},
		{name: "missing value", args: []string{"--state-dir"}, wantErr: "--state-dir needs a value"},
		{name: "bad short switch", args: []string{"-q=maybe", "poststop"}, wantErr: `invalid boolean value "maybe" for -q: want true or false`},
		{name: "check-settings not first", args: []string{"--state-dir", "/x", "--check-settings", "poststop"}, wantErr: "--check-settings must be the first argument, spelled exactly so"},
		{name: "check-settings spelt otherwise", args: []string{"-check-settings", "poststop"}, wantErr: "--check-settings must be the first argument, spelled exactly so"},
		{name: "malformed duration flag", args: []string{"--kill-grace=soon", "poststop"}, wantErr: `invalid value "soon" for --kill-grace: `},
		{name: "bare seconds", args: []string{"--deadline", "5", "poststop"}, want: func(s *settings) { s.deadline = 5 * time.Second }, rest: []string{"poststop"}},
		{name: "bare seconds in a variable", env: map[string]string{"KC_KILL_GRACE": "2"}, args: []string{"poststop"}, want: func(s *settings) { s.killGrace = 2 * time.Second }, rest: []string{"poststop"}},
		{name: "quiet", args: []string{"-q", "poststop"}, want: func(s *settings) { s.quiet, s.level = true, slog.LevelWarn }, rest: []string{"poststop"}},
		{name: "log level", env: map[string]string{"KC_LOG_LEVEL": "error"}, args: []string{"poststop"}, want: func(s *settings) { s.logLevel, s.level = "error", slog.LevelError }, rest: []string{"poststop"}},
		{name: "bad log level", args: []string{"--log-level", "loud", "poststop"}, wantErr: "--log-level must be debug, info, warn or error"},
		{name: "duration without a unit", args: []string{"--deadline", "5x", "poststop"}, wantErr: `invalid value "5x" for --deadline: `},
		{name: "malformed duration variable", env: map[string]string{"KC_KILL_GRACE": "soon"}, args: []string{"poststop"}, wantErr: `invalid value "soon" for $KC_KILL_GRACE (--kill-grace)`},
		// The variable is wrong whatever the flag says.
		{name: "malformed variable under a good flag", env: map[string]string{"KC_HOOK_DEADLINE": "1x"}, args: []string{"--deadline=1s", "poststop"}, wantErr: "$KC_HOOK_DEADLINE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEnv(t, tt.env)
			cl, err := parseCommandLine(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := defaults
			if tt.want != nil {
				tt.want(&want)
			}
			if cl.settings != want {
				t.Errorf("settings = %+v, want %+v", cl.settings, want)
			}
			if cl.help != tt.help || cl.version != tt.version {
				t.Errorf("help, version = %v, %v; want %v, %v", cl.help, cl.version, tt.help, tt.version)
			}
			if !tt.help && !slices.Equal(cl.args, tt.rest) {
				t.Errorf("arguments = %q, want %q", cl.args, tt.rest)
			}
		})
	}
}

// TestUsage: what a person or a runtime sees for help, version and bad
// invocations, and the exit status. Every usage error is one line on
// stderr that ends with a pointer to --help, and exit status 2.
func TestUsage(t *testing.T) {
	const state = `{"id":"` + cid + `","status":"stopped"}`
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stdout []string // substrings of stdout; nil: stdout is empty
		stderr string   // a substring of stderr; "" with exit 0: stderr is empty
	}{
		{name: "help", args: []string{"--help"}, stdout: []string{"Usage: kc-hook [options] STAGE < state.json", "createRuntime (or its old name prestart)", "supervise  run COMMAND", "--version, -v"}},
		{name: "short help", args: []string{"-h"}, stdout: []string{"Options:\n   --bpf MODE"}},
		{name: "help twice", args: []string{"-h", "--help"}, stdout: []string{"Usage: kc-hook"}},
		{name: "help ignores the stage's input", args: []string{"--state-dir=rel", "--help"}, stdout: []string{"Usage: kc-hook"}},
		{name: "help after the stage", args: []string{"poststop", "--help"}, stdout: []string{"Usage: kc-hook"}},
		{name: "help after a bad flag", args: []string{"--nope", "--help"}, code: exitBadInput, stderr: "kc-hook: unknown flag --nope (see kc-hook --help)\n"},
		{name: "help before supervise", args: []string{"--help", "supervise"}, stdout: []string{"Usage: kc-hook [options] STAGE"}},
		{name: "version", args: []string{"--version"}, stdout: []string{"kc-hook dev\n"}},
		{name: "short version", args: []string{"-v", "poststop"}, stdout: []string{"kc-hook dev\n"}},
		{name: "version command", args: []string{"version"}, stdout: []string{"kc-hook dev\n"}},
		{name: "version command after options", args: []string{"--state-dir=/nonexistent/kc", "version"}, stdout: []string{"kc-hook dev\n"}},
		{name: "version needs good variables", env: map[string]string{"KC_KILL_GRACE": "x"}, args: []string{"--version"}, code: exitBadInput, stderr: "$KC_KILL_GRACE"},
		{name: "no stage", code: exitBadInput, stderr: "kc-hook: want one STAGE after the options, got [] (see kc-hook --help)\n"},
		{name: "flag after the stage", args: []string{"poststop", "--kill-grace=1s"}, code: exitBadInput, stderr: `kc-hook: want one STAGE after the options, got ["poststop" "--kill-grace=1s"] (see kc-hook --help)` + "\n"},
		{name: "unknown flag", args: []string{"--nope", "poststop"}, code: exitBadInput, stderr: "kc-hook: unknown flag --nope (see kc-hook --help)\n"},
		{name: "flag name with a newline", args: []string{"--no\npe", "poststop"}, code: exitBadInput, stderr: `-no\npe`},
		{name: "malformed flag", args: []string{"--kill-grace=soon", "poststop"}, code: exitBadInput, stderr: "kc-hook: invalid value \"soon\" for --kill-grace: time: invalid duration \"soon\" (see kc-hook --help)\n"},
		{name: "malformed variable", env: map[string]string{"KC_HOOK_DEADLINE": "soon"}, args: []string{"poststop"}, code: exitBadInput,
			stderr: "kc-hook: invalid value \"soon\" for $KC_HOOK_DEADLINE (--deadline): time: invalid duration \"soon\" (see kc-hook --help)\n"},
		{name: "zero variable", env: map[string]string{"KC_KILL_GRACE": "0s"}, args: []string{"poststop"}, code: exitBadInput, stderr: "kc-hook: --kill-grace and --deadline must be positive (see kc-hook --help)\n"},
		{name: "relative state dir from the environment", env: map[string]string{"KC_STATE_DIR": "rel"}, args: []string{"poststop"}, code: exitBadInput, stderr: "--state-dir must be an absolute path"},
		{name: "empty comm from the environment", env: map[string]string{"KC_SUPERVISOR_COMM": ","}, args: []string{"--state-dir=/nonexistent/kc", "poststop"}, code: exitBadInput, stderr: "kc-hook: --supervisor-comm names no process (see kc-hook --help)\n"},
		{name: "unknown stage", args: []string{"prestop"}, code: exitBadInput, stderr: `unknown stage "prestop"`},
		{name: "supervise help", args: []string{"supervise", "--help"}, stdout: []string{"Usage: kc-hook [--state-dir DIR] [--kill-grace D] supervise", "[$KC_SUPERVISE_MAX_RESTARTS]", "--help, -h"}},
		{name: "supervise help after its arguments", args: []string{"--kill-grace=1s", "supervise", cid, "2", "5", "-h", "--", "/bin/true"}, stdout: []string{"kc-hook [--state-dir DIR] [--kill-grace D] supervise"}},
		{name: "supervise help under bad values", args: []string{"supervise", "--pdeathsig=STOP", "-help"}, stdout: []string{"--pdeathsig SIGNAL"}},
		{name: "supervise help is not a subcommand", args: []string{"supervise", "help"}, code: exitBadInput, stderr: "kc-hook supervise: want CONTAINER-ID INIT-PID INIT-START-TICKS before --, got [\"help\"] (see kc-hook supervise --help)\n"},
		{name: "supervise without arguments", args: []string{"supervise"}, code: exitBadInput, stderr: "kc-hook supervise: want CONTAINER-ID INIT-PID INIT-START-TICKS before --, got [] (see kc-hook supervise --help)\n"},
		{name: "supervise with a bad pid", args: []string{"supervise", cid, "1", "5", "--", "/bin/true"}, code: exitBadInput, stderr: "init pid"},
		{name: "supervise with a bad signal", args: []string{"supervise", "--pdeathsig=STOP", cid, "2", "5", "--", "/bin/true"}, code: exitBadInput, stderr: `signal "STOP"`},
		{name: "supervise with a relative state dir", args: []string{"--state-dir=rel", "supervise", cid, "2", "5", "--", "/bin/true"}, code: exitBadInput, stderr: "kc-hook supervise: --state-dir must be an absolute path"},
		{name: "supervise kill grace beats the global one", args: []string{"--kill-grace=1s", "supervise", "--kill-grace=0s", cid, "2", "5", "--", "/bin/true"}, code: exitBadInput, stderr: "--kill-grace must be positive"},
		{name: "supervise zero refresh", args: []string{"supervise", "--refresh=0s", cid, "2", "5", "--", "/bin/true"}, code: exitBadInput, stderr: "--refresh must be positive"},
		{name: "supervise negative init poll", env: map[string]string{"KC_SUPERVISE_INIT_POLL": "-1s"}, args: []string{"supervise", cid, "2", "5", "--", "/bin/true"}, code: exitBadInput, stderr: "--init-poll must be positive"},
		{name: "supervise unknown flag", args: []string{"supervise", "--nope"}, code: exitBadInput, stderr: "kc-hook supervise: unknown flag --nope (see kc-hook supervise --help)\n"},
		{name: "supervise malformed variable", env: map[string]string{"KC_SUPERVISE_MAX_RESTARTS": "x"}, args: []string{"supervise"}, code: exitBadInput,
			stderr: "kc-hook supervise: invalid value \"x\" for $KC_SUPERVISE_MAX_RESTARTS (--max-restarts): not a whole number (see kc-hook supervise --help)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEnv(t, tt.env)
			code, stdout, stderr := runHook(t, state, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tt.code, stderr)
			}
			if code == exitBadInput {
				cmd, _, _ := strings.Cut(stderr, ": ")
				if !isOneLine(stderr) || !strings.HasPrefix(cmd, "kc-hook") || !strings.HasSuffix(stderr, " (see "+cmd+" --help)\n") {
					t.Errorf("usage error is not one line ending with a pointer to --help: %q", stderr)
				}
			}
			if !strings.Contains(stderr, tt.stderr) || (tt.stderr == "" && stderr != "") {
				t.Errorf("stderr = %q, want %q", stderr, tt.stderr)
			}
			for _, w := range tt.stdout {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			if tt.stdout == nil && stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
		})
	}
}

// TestHelpListsEveryOption: --help shows every option with its default
// and variable, in the form the reliability suite reads back (a line
// starting with --NAME, the variable as [$VAR]).
func TestHelpListsEveryOption(t *testing.T) {
	flagRE := regexp.MustCompile(`^\s+--([a-z0-9-]+)`)
	envRE := regexp.MustCompile(`\[\$([A-Z0-9_]+)\]`)
	for _, page := range []struct {
		name string
		help func(io.Writer)
		fs   *flag.FlagSet
		env  map[string]string
	}{
		{"kc-hook", writeHookHelp, new(commandLine).flagSet(), hookEnv},
		{"kc-hook supervise", writeSuperviseHelp, new(superviseSettings).flagSet(), superviseEnv},
	} {
		t.Run(page.name, func(t *testing.T) {
			var b strings.Builder
			page.help(&b)
			// A flag's entry is its line and the ones wrapped below it,
			// indented deeper, joined.
			lines := map[string]string{}
			all := strings.Split(b.String(), "\n")
			for i, l := range all {
				if m := flagRE.FindStringSubmatch(l); m != nil {
					for _, next := range all[i+1:] {
						if !strings.HasPrefix(next, "    ") || flagRE.MatchString(next) {
							break
						}
						l += " " + strings.TrimSpace(next)
					}
					lines[m[1]] = l
				}
			}
			for name := range page.env {
				if page.fs.Lookup(name) == nil {
					t.Errorf("variable %s is for --%s, which is no flag", page.env[name], name)
				}
			}
			page.fs.VisitAll(func(f *flag.Flag) {
				if len(f.Name) == 1 {
					return // the short form of a long flag
				}
				l, ok := lines[f.Name]
				if !ok {
					t.Errorf("--%s is not listed:\n%s", f.Name, b.String())
					return
				}
				if m := envRE.FindStringSubmatch(l); (m == nil && page.env[f.Name] != "") || (m != nil && m[1] != page.env[f.Name]) {
					t.Errorf("--%s: line %q does not name $%s", f.Name, l, page.env[f.Name])
				}
				if !strings.Contains(l, "(default: ") && f.Value.(flag.Getter).Get() != false {
					t.Errorf("--%s: line %q shows no default", f.Name, l)
				}
			})
			if _, ok := lines["help"]; !ok {
				t.Errorf("--help is not listed")
			}
		})
	}
	var b strings.Builder
	writeHookHelp(&b)
	// Words, not columns: the text is wrapped.
	text := strings.Join(strings.Fields(b.String()), " ")
	for _, want := range []string{"--state-dir DIR", "ledger DIR: this user's, not writable by others, no symlink, or not used (default: " + ledger.DefaultDir(userns.HostEUID()) + ") [$KC_STATE_DIR]", "wait between SIGTERM and SIGKILL (default: 5s) [$KC_KILL_GRACE]", "--help, -h ", "--version, -v "} {
		if !strings.Contains(text, strings.TrimSpace(want)) {
			t.Errorf("kc-hook --help lacks %q", want)
		}
	}
}

// TestUnusableStateDirLeavesATrace: a hook that cannot write its state dir
// (a rootless user's hook pointed at root's) says so where the user will
// look, at every stage, since runc discards its stderr.
func TestUnusableStateDirLeavesATrace(t *testing.T) {
	for _, stage := range []string{"createRuntime", "poststop"} {
		t.Run(stage, func(t *testing.T) {
			withEnv(t, nil)
			trace := withTrace(t)
			blocker := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(blocker, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(blocker, "state")
			code, _, stderr := runHook(t, `{"id":"`+cid+`","pid":`+itoa(os.Getpid())+`,"status":"stopped"}`, "--state-dir", state, stage)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			data, err := os.ReadFile(trace)
			if err != nil {
				t.Fatalf("no trace: %v (stderr %q)", err, stderr)
			}
			for _, want := range []string{`"container":"` + cid + `"`, `"stage":"` + stage + `"`, `"state_dir":"` + state + `"`, "not a directory"} {
				if !strings.Contains(string(data), want) {
					t.Errorf("trace lacks %s: %s", want, data)
				}
			}
		})
	}
	t.Run("a usable state dir leaves none", func(t *testing.T) {
		withEnv(t, nil)
		trace := withTrace(t)
		code, _, stderr := runHook(t, `{"id":"`+cid+`","status":"stopped"}`, "--state-dir", t.TempDir(), "poststop")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if _, err := os.Stat(trace); !os.IsNotExist(err) {
			t.Errorf("a trace was left: %v", err)
		}
	})
}

// TestHelpWidth: kc-hook's help texts fit 80 columns, as kc-janitor's.
func TestHelpWidth(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"supervise", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, _ := runHook(t, "", args...)
			if code != exitOK || stdout == "" {
				t.Fatalf("exit %d: %q", code, stdout)
			}
			for i, l := range strings.Split(stdout, "\n") {
				if len(l) > helpWidth {
					t.Errorf("line %d is %d columns: %q", i+1, len(l), l)
				}
			}
		})
	}
}

// TestStagesRunWithoutTheCollector: a stage runs with the garbage
// collector off (oneshot.Tune); a bad stage name is refused before that.
func TestStagesRunWithoutTheCollector(t *testing.T) {
	t.Setenv("GOGC", "") // restored after the test
	os.Unsetenv("GOGC")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	if code, _, _ := runHook(t, "", "--state-dir", t.TempDir(), "nostage"); code != exitBadInput {
		t.Fatalf("exit %d for a bad stage, want %d", code, exitBadInput)
	}
	if gc := debug.SetGCPercent(100); gc != 100 {
		t.Errorf("after a bad stage, GC percent %d, want 100", gc)
	}
	dir := t.TempDir()
	if code, _, stderr := runHook(t, `{"ociVersion":"1.0.2","id":"`+strings.Repeat("ab", 32)+`","status":"stopped","bundle":"`+dir+`"}`, "--state-dir", dir, "poststop"); code != 0 {
		t.Fatalf("poststop exit %d: %s", code, stderr)
	}
	if gc := debug.SetGCPercent(100); gc != -1 {
		t.Errorf("after poststop, GC percent %d, want -1 (off)", gc)
	}
}

// TestDoctorKnowsTheHooksDeadline: kc-janitor doctor judges a descriptor's
// timeout by kc-hook's default deadline and poststop's grace; it cannot
// import them (kc-hook links none of the janitor), so they are compared
// here.
func TestDoctorKnowsTheHooksDeadline(t *testing.T) {
	var cl commandLine
	f := cl.flagSet().Lookup("deadline")
	if f == nil || f.DefValue != doctor.HookDefaultDeadline.String() {
		t.Errorf("kc-hook's --deadline defaults to %v, doctor assumes %v", f, doctor.HookDefaultDeadline)
	}
	if poststopGrace != doctor.HookPoststopGrace {
		t.Errorf("poststop's grace is %v, doctor assumes %v", poststopGrace, doctor.HookPoststopGrace)
	}
	if hook.LaunchMargin != doctor.HookLaunchMargin {
		t.Errorf("a launch needs %v left, doctor assumes %v", hook.LaunchMargin, doctor.HookLaunchMargin)
	}
}
