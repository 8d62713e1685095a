package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// goTest runs go test on the fake package with args and returns its
// stdout and exit code.
func goTest(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"test", "-count=1"}, append(args, "./testdata/fake")...)...)
	cmd.Env = append(os.Environ(), "KC_TESTSUMMARY_FAKE=1", "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// timing masks durations, which differ between two runs.
var timing = regexp.MustCompile(`\(?\d+\.\d+s\)?`)

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(timing.ReplaceAllString(s, "T"), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestPlainOutput: the filtered -json output has the lines go test
// prints without -json, in its order, and the skips with their reasons.
func TestPlainOutput(t *testing.T) {
	plain, code := goTest(t)
	if code != 1 {
		t.Fatalf("go test exit %d, want 1:\n%s", code, plain)
	}
	js, _ := goTest(t, "-json")
	var got bytes.Buffer
	skips, err := run(strings.NewReader(js), &got, false)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := lines(got.String()), lines(plain); !slices.Equal(g, w) {
		t.Errorf("filtered -json output:\n%s\nwant go test's:\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
	want := []Skip{
		{"TestSkip", "no dockerd: KC_TEST_DOCKER_URL is not set", ""},
		{"TestSkipMultiline", "first line second line", ""},
		{"TestSkipNow", "(no reason given)", ""},
		{"TestSub/skipped", "sub reason", ""},
	}
	var have []Skip
	for _, s := range skips {
		have = append(have, Skip{s.Test, s.Reason, ""})
	}
	slices.SortFunc(have, func(a, b Skip) int { return strings.Compare(a.Package, b.Package) })
	if !slices.Equal(have, want) {
		t.Errorf("skips %q, want %q", have, want)
	}
	var sum bytes.Buffer
	summary(&sum, skips)
	for _, w := range []string{
		"skipped 4 tests (go test -v shows each one's log):\n",
		"  scripts/testsummary/testdata/fake  TestSkip: no dockerd: KC_TEST_DOCKER_URL is not set\n",
	} {
		if !strings.Contains(sum.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, sum.String())
		}
	}
}

// TestVerbose: with -v every line goes through.
func TestVerbose(t *testing.T) {
	js, _ := goTest(t, "-json", "-v")
	var got bytes.Buffer
	if _, err := run(strings.NewReader(js), &got, true); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"=== RUN   TestPass", "a log line of a passing test", "--- SKIP: TestSkip", "--- FAIL: TestFail"} {
		if !strings.Contains(got.String(), w) {
			t.Errorf("-v output lacks %q:\n%s", w, got.String())
		}
	}
}

// TestExitStatus: run as a wrapper, testsummary exits with go test's
// status and ends with the summary.
func TestExitStatus(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testsummary")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		run  string
		code int
		want string
	}{
		{"TestFail", 1, "--- FAIL: TestFail"},
		{"TestPass|TestSkip$", 0, "skipped 1 test (go test -v shows each one's log):\n"},
	} {
		cmd := exec.Command(bin, "go", "test", "-json", "-count=1", "-run", tc.run, "./testdata/fake")
		cmd.Env = append(os.Environ(), "KC_TESTSUMMARY_FAKE=1", "CGO_ENABLED=0")
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("-run %s: exit %d, want %d; output lacks %q?\n%s", tc.run, code, tc.code, tc.want, out)
		}
		if tc.code == 0 && !strings.HasPrefix(string(out), "ok  \t") {
			t.Errorf("-run %s: output does not start with go test's ok line:\n%s", tc.run, out)
		}
	}
}
