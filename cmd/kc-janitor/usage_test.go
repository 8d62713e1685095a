package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
)

// runJanitor runs the built binary, so that what run() prints and returns is
// what is checked.
func runJanitor(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(janitorBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	socks := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"misspelled command", []string{"reconsile"}, `"reconsile" is not a kc-janitor command; did you mean reconcile?`},
		{"misspelled after a global flag", []string{"--format", "json", "sweeep"}, "did you mean sweep?"},
		{"no such command", []string{"frobnicate"}, "is not a kc-janitor command (see kc-janitor --help)"},
		{"stray argument", []string{"sweep", "--socket-dir", socks, "/some/dir"}, `sweep takes no arguments, but was given "/some/dir"`},
		{"stray argument to reconcile", []string{"reconcile", "now"}, "reconcile takes no arguments"},
		{"bad duration", []string{"reconcile", "--min-age", "5x"}, `invalid value "5x" for --min-age: ` + cliapp.DurationHint},
		{"misspelled flag", []string{"sweep", "--socket-dri", socks}, "unknown flag --socket-dri; did you mean --socket-dir?"},
		{"misspelled switch", []string{"reconcile", "--aply"}, "unknown flag --aply; did you mean --apply?"},
		{"misspelled global flag after the command", []string{"reconcile", "--formt", "json"}, "unknown flag --formt; did you mean --format?"},
		{"misspelled global flag before the command", []string{"--stat-dir", "/x", "status"}, "unknown flag --stat-dir; did you mean --state-dir?"},
		{"flag of another command", []string{"status", "--aply"}, "unknown flag --aply (see kc-janitor status --help)"},
		{"unknown flag", []string{"reconcile", "--frobnicate"}, "unknown flag --frobnicate (see kc-janitor reconcile --help)"},
		{"unknown global flag", []string{"--frobnicate", "reconcile"}, "unknown flag --frobnicate (see kc-janitor --help)"},
		{"bad number", []string{"sweep", "--workers", "x"}, `invalid value "x" for --workers: want a whole number`},
		{"bad switch", []string{"reconcile", "--apply=maybe"}, `invalid boolean value "maybe" for --apply: want true or false`},
		{"flag without its value", []string{"--state-dir"}, "kc-janitor: --state-dir needs a value"},
		{"command flag without its value", []string{"reconcile", "--min-age"}, "kc-janitor: --min-age needs a value"},
		{"bad short switch", []string{"status", "-q=2"}, `invalid boolean value "2" for -q: want true or false`},
		{"a flag after a command's help", []string{"reconcile", "help", "--flag"}, `reconcile help takes nothing after it, but was given "--flag"`},
		{"help on no command", []string{"help", "reconcil"}, `"reconcil" is not a kc-janitor command; did you mean reconcile?`},
		{"version before a command", []string{"-v", "reconcile"}, "--version (-v) prints the version and runs no command, yet reconcile follows it"},
		{"version after a global flag", []string{"--state-dir", "/x", "--version", "status"}, "yet status follows it"},
		{"bad log level", []string{"sweep", "--socket-dir", socks, "--log-level", "loud"}, "--log-level must be debug, info, warn or error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runJanitor(t, nil, tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, exitUsage, stderr)
			}
			if stdout != "" {
				t.Errorf("a usage error printed on stdout: %q", stdout)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q lacks %q", stderr, tc.want)
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") > 0 || strings.Contains(stderr, " -min-age") {
				t.Errorf("not one line with the flag's real name: %q", stderr)
			}
		})
	}
}

// TestUsageErrorsNameTheVariable: a value refused from a KC_* variable is
// named by the variable (the flag was never typed), and by the flag when
// the flag gave it.
func TestUsageErrorsNameTheVariable(t *testing.T) {
	socks := t.TempDir()
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"KC_FORMAT=xml"}, []string{"status"}, `kc-janitor: $KC_FORMAT (--format) must be text or json, not "xml"`},
		{[]string{"KC_FORMAT=json"}, []string{"status", "--format", "xml"}, `kc-janitor: --format must be text or json, not "xml"`},
		{[]string{"KC_PROBE_WORKERS=0"}, []string{"sweep", "--socket-dir", socks}, "kc-janitor: $KC_PROBE_WORKERS (--workers) must be positive"},
		{[]string{"KC_PROBE_WORKERS=0"}, []string{"sweep", "--socket-dir", socks, "--workers=0"}, "kc-janitor: --workers must be positive"},
		// The command's own flag's variables: sweep reads KC_CONTAINER,
		// never reconcile's KC_RECONCILE_CONTAINERS.
		{[]string{"KC_RECONCILE_CONTAINERS=x/y", "KC_CONTAINER=x/y"}, []string{"sweep", "--socket-dir", socks}, `kc-janitor: $KC_CONTAINER (--container) "x/y" is not a container name, ID, ID prefix or namespace/pod/container`},
		// A flag's value that looks like the end of the options.
		{[]string{"KC_STATE_DIR=/x"}, []string{"reconcile", "--podman-arg", "--", "--state-dir", "rel"}, `kc-janitor: --state-dir must be an absolute path, not "rel"`},
	} {
		t.Run(strings.Join(append(tc.env, tc.args...), " "), func(t *testing.T) {
			code, _, stderr := runJanitor(t, tc.env, tc.args...)
			if code != exitUsage || strings.TrimSpace(stderr) != tc.want {
				t.Errorf("exit %d, stderr %q; want %d, %q", code, stderr, exitUsage, tc.want)
			}
		})
	}
}

// TestDurationsEverywhere: every duration flag takes what --idle always
// took: a Go duration or a bare number of seconds, on the command line or
// in its variable.
func TestDurationsEverywhere(t *testing.T) {
	app := newApp()
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"kc-janitor", "reconcile", "--min-age", "5"}, []string{"kc-janitor", "reconcile", "--min-age", "5s"}},
		{[]string{"kc-janitor", "reconcile", "--min-age=1.5"}, []string{"kc-janitor", "reconcile", "--min-age=1.5s"}},
		{[]string{"kc-janitor", "watch", "-interval", "60", "--idle", "5"}, []string{"kc-janitor", "watch", "-interval", "60s", "--idle", "5"}},
		{[]string{"kc-janitor", "reconcile", "--min-age", "5m"}, []string{"kc-janitor", "reconcile", "--min-age", "5m"}},
		{[]string{"kc-janitor", "reconcile", "--", "--min-age", "5"}, []string{"kc-janitor", "reconcile", "--", "--min-age", "5"}},
	} {
		t.Run(strings.Join(tc.in[1:], " "), func(t *testing.T) {
			if got := cliapp.NormalizeDurations(app, tc.in); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	socks := t.TempDir()
	if code, _, stderr := runJanitor(t, nil, "sweep", "--socket-dir", socks, "--timeout", "2", "--hashed-min-age", "30"); code != exitOK {
		t.Errorf("sweep --timeout 2: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runJanitor(t, []string{"KC_PROBE_TIMEOUT=3"}, "sweep", "--socket-dir", socks); code != exitOK {
		t.Errorf("KC_PROBE_TIMEOUT=3: exit %d: %s", code, stderr)
	}
}

// TestQuietAndLogLevel: a quiet run prints nothing on stdout unless
// something failed, for cron, which mails whatever it prints; its findings
// and summary go to the log file. A log file in a missing directory is an
// error, never a new directory. Without --quiet a finding is printed once,
// not again as a log line on stderr.
func TestQuietAndLogLevel(t *testing.T) {
	socks := t.TempDir()
	logf := filepath.Join(t.TempDir(), "sweeper.log")
	for _, args := range [][]string{
		{"-q", "sweep", "--socket-dir", socks},
		{"sweep", "--quiet", "--socket-dir", socks},
		{"sweep", "--log-level", "warn", "--socket-dir", socks},
		{"cull", "-q", "--socket-dir", socks},
	} {
		code, stdout, stderr := runJanitor(t, []string{"KC_SWEEPER_LOG=" + logf}, args...)
		if code != exitOK || stdout != "" || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want silence", args, code, stdout, stderr)
		}
	}
	if code, stdout, stderr := runJanitor(t, []string{"KC_LOG_LEVEL=error"}, "sweep", "--socket-dir", socks); code != exitOK || stdout != "" || stderr != "" {
		t.Errorf("KC_LOG_LEVEL=error: exit %d, %q %q", code, stdout, stderr)
	}
	data, err := os.ReadFile(logf)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "msg=sweep "); n != 3 {
		t.Errorf("want one summary line per sweep run, got %d:\n%s", n, data)
	}

	missing := filepath.Join(t.TempDir(), "missing", "sweeper.log")
	if code, _, stderr := runJanitor(t, []string{"KC_SWEEPER_LOG=" + missing}, "sweep", "-q", "--socket-dir", socks); code != exitUsage || !strings.Contains(stderr, missing) {
		t.Errorf("log file in a missing directory: exit %d, stderr %q; want 2 naming the file", code, stderr)
	}
	if _, err := os.Stat(filepath.Dir(missing)); err == nil {
		t.Errorf("the log file's directory was created")
	}

	orphan := orphanSock(t, socks, goneSockName(t))
	code, stdout, stderr := runJanitor(t, []string{"KC_SWEEPER_LOG=" + logf}, "-q", "sweep", "--socket-dir", socks)
	if code != exitOK || stdout != "" || stderr != "" {
		t.Errorf("a quiet run with a finding: exit %d, stdout %q, stderr %q; want silence", code, stdout, stderr)
	}
	// The audit log gets the candidate, marked as the seed scripts did.
	if data, _ := os.ReadFile(logf); !strings.Contains(string(data), `msg="[DRY-RUN] would unlink" cmd=sweep path=`+orphan) {
		t.Errorf("no [DRY-RUN] line for %s in the log file:\n%s", orphan, data)
	}
	code, stdout, stderr = runJanitor(t, nil, "sweep", "--socket-dir", socks)
	if code != exitOK || !strings.Contains(stdout, "[DRY-RUN] would unlink "+orphan) {
		t.Errorf("without --quiet the finding is printed: exit %d, %q", code, stdout)
	}
	// A flag typed before the command beats the environment, as after.
	for _, args := range [][]string{
		{"--quiet=false", "sweep", "--socket-dir", socks},
		{"sweep", "--quiet=false", "--socket-dir", socks},
	} {
		code, stdout, _ := runJanitor(t, []string{"KC_QUIET=1"}, args...)
		if code != exitOK || !strings.Contains(stdout, "[DRY-RUN] would unlink "+orphan) {
			t.Errorf("KC_QUIET=1 %q: exit %d, stdout %q; want the finding printed", args, code, stdout)
		}
	}
	// An empty variable reads as false, as urfave/cli reads it.
	for _, args := range [][]string{{"-q", "sweep", "--socket-dir", socks}, {"sweep", "-q", "--socket-dir", socks}} {
		if code, stdout, _ := runJanitor(t, []string{"KC_QUIET="}, args...); code != exitOK || stdout != "" {
			t.Errorf("KC_QUIET= %q: exit %d, stdout %q; want quiet", args, code, stdout)
		}
	}
	if strings.Contains(stderr, "would unlink") {
		t.Errorf("by default a one-shot command's findings are on stdout only, stderr %q", stderr)
	}
}

// TestLogFormatForJournal: no time= when stderr is the journal; durations
// in JSON logs are seconds, never nanoseconds.
func TestLogFormatForJournal(t *testing.T) {
	socks := t.TempDir()
	_, _, stderr := runJanitor(t, []string{"JOURNAL_STREAM=8:1234"}, "watch", "--once", "--no-reconcile", "--socket-dir", socks)
	if stderr == "" || strings.Contains(stderr, "time=") {
		t.Errorf("JOURNAL_STREAM set: %q", stderr)
	}
	_, _, stderr = runJanitor(t, nil, "watch", "--once", "--no-reconcile", "--socket-dir", socks)
	if !strings.Contains(stderr, "time=") {
		t.Errorf("a terminal gets times: %q", stderr)
	}
	code, _, stderr := runJanitor(t, nil, "watch", "-q", "--once", "--no-reconcile", "--socket-dir", socks)
	if code != exitOK || stderr != "" {
		t.Errorf("a clean quiet watch --once: exit %d, stderr %q", code, stderr)
	}
}

// TestVersionAndFormat: version and --version print the same; --format
// json is honoured by version and refused by watch, which prints no report.
func TestVersionAndFormat(t *testing.T) {
	_, a, _ := runJanitor(t, nil, "version")
	_, b, _ := runJanitor(t, nil, "--version")
	if a != b || !strings.HasPrefix(a, "kc-janitor ") {
		t.Errorf("version %q, --version %q", a, b)
	}
	if code, out, _ := runJanitor(t, nil, "version", "--format", "json"); code != exitOK || !strings.Contains(out, `"version":`) {
		t.Errorf("version --format json: exit %d, %q", code, out)
	}
	if code, _, stderr := runJanitor(t, nil, "watch", "--once", "--format", "json"); code != exitUsage || !strings.Contains(stderr, "--log-format json") {
		t.Errorf("watch --format json: exit %d, %q", code, stderr)
	}
	// KC_FORMAT=json in /etc/default/kc-janitor, for the other commands,
	// must not stop the watch service or its timer.
	if code, _, stderr := runJanitor(t, []string{"KC_FORMAT=json"}, "watch", "--once", "--no-reconcile", "--socket-dir", t.TempDir()); code != exitOK {
		t.Errorf("KC_FORMAT=json watch: exit %d, %q", code, stderr)
	}
	// Typed, it is refused whatever the environment says.
	if code, _, stderr := runJanitor(t, []string{"KC_FORMAT=json"}, "watch", "--once", "--format", "json"); code != exitUsage {
		t.Errorf("KC_FORMAT=json watch --format json: exit %d, %q", code, stderr)
	}
	// The same, run in this process: the command line is run's, not the
	// program's (the test binary's own flags here).
	// Were the refusal to go, the round it ran would change nothing.
	t.Setenv("KC_FORMAT", "json")
	for _, v := range []string{"KC_APPLY", "KC_SWEEP", "KC_RECONCILE_APPLY"} {
		t.Setenv(v, "")
	}
	if code, out := runJanitorCapture(t, "watch", "--once", "--format", "json", "--no-reconcile", "--socket-dir", t.TempDir(),
		"--engine", "podman", "--podman-url", "unix://"+t.TempDir()+"/absent.sock"); code != exitUsage {
		t.Errorf("in-process KC_FORMAT=json watch --format json: exit %d, %q", code, out)
	}
}

// TestUsageErrorsLeaveAnAuditLine: a command line that cannot be parsed
// (an unknown flag, a malformed duration) still leaves its line in the
// log file the environment names: the audit weeks never read silence.
func TestUsageErrorsLeaveAnAuditLine(t *testing.T) {
	for _, tt := range []struct {
		env  string
		args []string
		want string
	}{
		{"KC_SWEEPER_LOG", []string{"sweep", "--bogus-flag"}, "cmd=sweep exit=2"},
		{"KC_CULLER_LOG", []string{"cull", "--timeout", "soon"}, "cmd=cull exit=2"},
		{"KC_LOG_FILE", []string{"reconcile", "--min-age", "soon"}, "cmd=reconcile exit=2"},
		// -v meant as "verbose" in a cron line: the run did nothing.
		{"KC_SWEEPER_LOG", []string{"-v", "sweep"}, "cmd=sweep exit=2"},
		// The error is in a global flag typed before the command.
		{"KC_SWEEPER_LOG", []string{"--bogus-flag", "sweep"}, "cmd=sweep exit=2"},
		{"KC_CULLER_LOG", []string{"--podman-timeout", "soon", "cull"}, "cmd=cull exit=2"},
		// The log names the variable that gave the value, as stderr does.
		{"KC_SWEEPER_LOG", []string{"sweep", "--socket-dir", "/nonexistent-kc"}, `cmd=sweep exit=2 err="$KC_PROBE_WORKERS (--workers) must be positive"`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			logf := filepath.Join(t.TempDir(), "audit.log")
			if code, _, _ := runJanitor(t, []string{tt.env + "=" + logf, "KC_PROBE_WORKERS=0"}, tt.args...); code != exitUsage {
				t.Fatalf("exit %d, want 2", code)
			}
			data, _ := os.ReadFile(logf)
			if !strings.Contains(string(data), `msg="run failed" `+tt.want) {
				t.Errorf("audit log %q lacks %q", data, tt.want)
			}
		})
	}
}

// TestContainerRefs: --container takes a name, an ID or ID prefix, or the
// CRI engine's namespace/pod/container; nothing else reaches an engine.
func TestContainerRefs(t *testing.T) {
	for _, tc := range []struct {
		ref string
		ok  bool
	}{
		{"web", true},
		{"f42f18001b73", true},
		{"my_app.1-2", true},
		{"default/web-7d9f/app", true},
		{"kube-system/coredns-5d78c9869d-abcde/coredns", true},
		{"x/y", false},
		{"a/b/c/d", false},
		{"a//c", false},
		{"/a/b", false},
		{"a/b/", false},
		{"../b/c", false},
		{"a/-b/c", false},
		{"", false},
	} {
		if got := containerRef().MatchString(tc.ref); got != tc.ok {
			t.Errorf("containerRef(%q) = %v, want %v", tc.ref, got, tc.ok)
		}
	}
}
