package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/supervise"
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
			withEnv(t, nil)
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

// TestParseCommandLine: each option comes from its flag, else from its
// environment variable, else from its default; parsing stops at STAGE.
func TestParseCommandLine(t *testing.T) {
	defaults := settings{
		stateDir:        "/run/kc-watchman",
		supervisorComm:  "kcserver",
		killGrace:       5 * time.Second,
		deadline:        20 * time.Second,
		supervisorsFile: supervise.DefaultAllowlistFile,
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
			},
			args: []string{"poststop"},
			want: func(s *settings) {
				*s = settings{stateDir: "/e", supervisorComm: "a,b", killGrace: 2 * time.Second,
					deadline: 3 * time.Second, logFile: "/e/log", supervisorsFile: "/e/s.json"}
			},
			rest: []string{"poststop"},
		},
		{
			name: "flags over environment",
			env:  map[string]string{"KC_STATE_DIR": "/e", "KC_KILL_GRACE": "2s", "KC_HOOK_LOG": "/e/log"},
			args: []string{"--state-dir=/f", "--kill-grace", "7s", "-log-file", "/f/log", "--deadline=1m", "createRuntime"},
			want: func(s *settings) {
				s.stateDir, s.killGrace, s.logFile, s.deadline = "/f", 7*time.Second, "/f/log", time.Minute
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
		{name: "supervise and its flags are left alone", args: []string{"--kill-grace=1s", "supervise", "--nope"}, want: func(s *settings) { s.killGrace = time.Second }, rest: []string{"supervise", "--nope"}},
		{name: "no stage", args: nil},
		{name: "help", args: []string{"--help"}, help: true},
		{name: "short help", args: []string{"-h", "poststop"}, help: true, rest: []string{"poststop"}},
		{name: "version", args: []string{"--version"}, version: true},
		{name: "short version", args: []string{"-v"}, version: true},
		{name: "help twice", args: []string{"-h", "--help"}, wantErr: "Cannot use two forms of the same flag: h help"},
		{name: "unknown flag", args: []string{"--nope", "poststop"}, wantErr: "flag provided but not defined: -nope"},
		{name: "missing value", args: []string{"--state-dir"}, wantErr: "flag needs an argument: -state-dir"},
		{name: "malformed duration flag", args: []string{"--kill-grace=soon", "poststop"}, wantErr: `invalid value "soon" for flag -kill-grace`},
		{name: "duration without a unit", args: []string{"--deadline", "5", "poststop"}, wantErr: `invalid value "5" for flag -deadline`},
		{
			name:    "malformed duration variable",
			env:     map[string]string{"KC_KILL_GRACE": "soon"},
			args:    []string{"poststop"},
			wantErr: `could not parse "soon" as duration value from environment variable "KC_KILL_GRACE" for flag kill-grace: time: invalid duration "soon"`,
		},
		{
			// The variable is wrong whatever the flag says.
			name:    "malformed variable under a good flag",
			env:     map[string]string{"KC_HOOK_DEADLINE": "1x"},
			args:    []string{"--deadline=1s", "poststop"},
			wantErr: `environment variable "KC_HOOK_DEADLINE"`,
		},
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
			if strings.Join(cl.args, " ") != strings.Join(tt.rest, " ") || len(cl.args) != len(tt.rest) {
				t.Errorf("arguments = %q, want %q", cl.args, tt.rest)
			}
			if cl.help != tt.help || cl.version != tt.version {
				t.Errorf("help, version = %v, %v; want %v, %v", cl.help, cl.version, tt.help, tt.version)
			}
		})
	}
}

// TestUsage: what a person or a runtime sees for help, version and bad
// invocations, and the exit status.
func TestUsage(t *testing.T) {
	const state = `{"id":"` + cid + `","status":"stopped"}`
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string // exact, or with want* below
		want   []string
	}{
		{name: "help", args: []string{"--help"}, code: exitOK, want: []string{"NAME:\n   kc-hook - OCI hook", "USAGE:\n   kc-hook [options] STAGE < state.json", "createRuntime (or its old name prestart)", "VERSION:\n   dev\n", "supervise  run COMMAND"}},
		{name: "short help", args: []string{"-h"}, code: exitOK, want: []string{"GLOBAL OPTIONS:"}},
		{name: "help ignores the stage's input", args: []string{"--state-dir=rel", "--help"}, code: exitOK, want: []string{"USAGE:"}},
		{name: "help on supervise", args: []string{"--help", "supervise"}, code: exitOK, want: []string{"kc-hook supervise - run COMMAND", "--max-restarts value"}},
		{name: "help on a stage", args: []string{"--help", "poststop"}, code: exitNoTopic, stderr: "No help topic for 'poststop'\n"},
		{name: "version", args: []string{"--version"}, code: exitOK, stderr: "kc-hook version dev\n"},
		{name: "short version", args: []string{"-v", "poststop"}, code: exitOK, stderr: "kc-hook version dev\n"},
		{name: "version needs good variables", env: map[string]string{"KC_KILL_GRACE": "x"}, args: []string{"--version"}, code: exitBadInput, want: []string{"KC_KILL_GRACE"}},
		{name: "no stage", code: exitBadInput, stderr: "kc-hook: exactly one STAGE argument is required (see --help)\n"},
		{name: "flag after the stage", args: []string{"poststop", "--kill-grace=1s"}, code: exitBadInput, stderr: "kc-hook: exactly one STAGE argument is required (see --help)\n"},
		{name: "unknown flag", args: []string{"--nope", "poststop"}, code: exitBadInput, stderr: "kc-hook: flag provided but not defined: -nope\n"},
		{name: "malformed flag", args: []string{"--kill-grace=soon", "poststop"}, code: exitBadInput, stderr: "kc-hook: invalid value \"soon\" for flag -kill-grace: parse error\n"},
		{name: "malformed variable", env: map[string]string{"KC_HOOK_DEADLINE": "soon"}, args: []string{"poststop"}, code: exitBadInput,
			stderr: "kc-hook: could not parse \"soon\" as duration value from environment variable \"KC_HOOK_DEADLINE\" for flag deadline: time: invalid duration \"soon\"\n"},
		{name: "zero variable", env: map[string]string{"KC_KILL_GRACE": "0s"}, args: []string{"poststop"}, code: exitBadInput, stderr: "kc-hook: --kill-grace and --deadline must be positive\n"},
		{name: "relative state dir from the environment", env: map[string]string{"KC_STATE_DIR": "rel"}, args: []string{"poststop"}, code: exitBadInput, want: []string{"--state-dir must be an absolute path"}},
		{name: "empty comm from the environment", env: map[string]string{"KC_SUPERVISOR_COMM": ","}, args: []string{"--state-dir=/nonexistent/kc", "poststop"}, code: exitBadInput, stderr: "kc-hook: --supervisor-comm names no process\n"},
		{name: "unknown stage", args: []string{"prestop"}, code: exitBadInput, want: []string{`unknown stage "prestop"`}},
		{name: "supervise help", args: []string{"supervise", "--help"}, code: exitOK, want: []string{"USAGE:\n   kc-hook [--state-dir DIR] [--kill-grace D] supervise", "[$KC_SUPERVISE_MAX_RESTARTS]"}},
		{name: "supervise without arguments", args: []string{"supervise"}, code: exitUsage, stderr: "kc-hook supervise: want CONTAINER-ID INIT-PID INIT-START-TICKS, got 0 arguments\n"},
		{name: "supervise with a bad pid", args: []string{"supervise", cid, "1", "5", "--", "/bin/true"}, code: exitUsage, want: []string{"init pid"}},
		{name: "supervise with a bad signal", args: []string{"supervise", "--pdeathsig=STOP", cid, "2", "5", "--", "/bin/true"}, code: exitUsage, want: []string{`signal "STOP"`}},
		{name: "supervise with a relative state dir", args: []string{"--state-dir=rel", "supervise", cid, "2", "5", "--", "/bin/true"}, code: exitUsage, want: []string{"kc-hook supervise: --state-dir must be an absolute path"}},
		{name: "supervise kill grace beats the global one", args: []string{"--kill-grace=1s", "supervise", "--kill-grace=0s", cid, "2", "5", "--", "/bin/true"}, code: exitUsage, want: []string{"--kill-grace must be positive"}},
		{name: "supervise unknown flag", args: []string{"supervise", "--nope"}, code: exitBadInput, want: []string{"Incorrect Usage: flag provided but not defined: -nope", "\nkc-hook: flag provided but not defined: -nope\n"}},
		{name: "supervise malformed variable", env: map[string]string{"KC_SUPERVISE_MAX_RESTARTS": "x"}, args: []string{"supervise"}, code: exitBadInput,
			want: []string{"\nkc-hook: could not parse \"x\" as int value from environment variable \"KC_SUPERVISE_MAX_RESTARTS\" for flag max-restarts"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEnv(t, tt.env)
			code, stderr := runHook(t, state, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tt.code, stderr)
			}
			if tt.stderr != "" && stderr != tt.stderr {
				t.Errorf("stderr = %q, want %q", stderr, tt.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
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
		text string
		opts []option
	}{
		{"kc-hook", hookHelp(), new(commandLine).options()},
		{"kc-hook supervise", superviseHelp(false), new(superviseSettings).options()},
	} {
		t.Run(page.name, func(t *testing.T) {
			lines := map[string]string{}
			for _, l := range strings.Split(page.text, "\n") {
				if m := flagRE.FindStringSubmatch(l); m != nil {
					lines[m[1]] = l
				}
			}
			if len(lines) != len(page.opts) {
				t.Errorf("%d option lines for %d options:\n%s", len(lines), len(page.opts), page.text)
			}
			for _, o := range page.opts {
				l, ok := lines[o.name]
				if !ok {
					t.Errorf("--%s is not listed", o.name)
					continue
				}
				if m := envRE.FindStringSubmatch(l); (m == nil && o.env != "") || (m != nil && m[1] != o.env) {
					t.Errorf("--%s: line %q does not name $%s", o.name, l, o.env)
				}
				if d := o.defaultText(); d != "" && !strings.Contains(l, "(default: "+d+")") {
					t.Errorf("--%s: line %q does not show the default %s", o.name, l, d)
				}
			}
		})
	}
	for _, want := range []string{`--state-dir DIR          ledger DIR (default: "/run/kc-watchman") [$KC_STATE_DIR]`, "--kill-grace value       wait between SIGTERM and SIGKILL (default: 5s) [$KC_KILL_GRACE]", "--help, -h ", "--version, -v "} {
		if !strings.Contains(hookHelp(), want) {
			t.Errorf("kc-hook --help lacks %q", want)
		}
	}
}
