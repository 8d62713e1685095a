// Command testsummary runs `go test -json ...`, prints what go test prints
// without -json, and ends with the tests that were skipped and why. It exits
// with go test's exit status. `make test` runs it; it is not part of any
// installed binary.
//
//	testsummary go test -json [flags] [packages]   # run it
//	go test -json ./... | testsummary              # or filter its output
//
// What is printed, as go test prints it without -json (or, when the flags
// ask for -v, everything): each package's "ok", "FAIL", "?" and build-error
// lines, and the whole output of every test that failed (its log lines and
// its "--- FAIL" line); a test that never finished (a panic, a timeout) has
// its output printed when its package ends. Then, when tests were skipped:
//
//	skipped 3 tests (go test -v shows each one's log):
//	  test/e2e      TestDockerReap: no dockerd: KC_TEST_DOCKER_URL is not set
//	  ...
//
// A skipped test's reason is the last message it logged (t.Skip's).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output events
}

// Skip is a skipped test and the reason it logged.
type Skip struct {
	Package, Test, Reason string
}

// filter turns go test -json events into go test's plain output.
type filter struct {
	out     io.Writer
	verbose bool
	// pending holds the output of tests that have not ended, by
	// package and test name, in order.
	pending map[string][]string
	order   map[string][]string // package -> test names with pending output
	skips   []Skip
	// anyFailed: a package failed, so go test's last line is "FAIL".
	anyFailed bool
}

func newFilter(out io.Writer, verbose bool) *filter {
	return &filter{out: out, verbose: verbose, pending: map[string][]string{}, order: map[string][]string{}}
}

func key(pkg, test string) string { return pkg + "\x00" + test }

// framing are the lines test2json's verbose mode adds around each test,
// which go test without -v does not print.
var framing = regexp.MustCompile(`^\s*(=== (RUN|PAUSE|CONT|NAME)\s|--- (PASS|SKIP): )`)

// line handles one line of go test -json's output.
func (f *filter) line(raw []byte) {
	var e event
	if err := json.Unmarshal(raw, &e); err != nil || (e.Action == "" && e.Output == "") {
		// Not an event (go's own errors, a stray line): print it.
		fmt.Fprintf(f.out, "%s\n", raw)
		return
	}
	switch e.Action {
	case "build-output":
		io.WriteString(f.out, e.Output)
	case "output":
		f.output(e)
	case "pass", "fail", "skip":
		if e.Test == "" {
			f.packageEnd(e.Package)
			return
		}
		k := key(e.Package, e.Test)
		lines := f.pending[k]
		delete(f.pending, k)
		switch {
		case e.Action == "fail" && !f.verbose:
			f.failed(e.Package, e.Test, lines)
		case e.Action == "skip":
			f.skips = append(f.skips, Skip{e.Package, e.Test, reason(lines)})
		}
	}
}

// failed prints a failed test's output as go test does without -v: its
// "--- FAIL" line first, then its log, with the output of its failed
// subtests nested in it, 4 columns further in; a subtest's goes into its
// parent's, printed when the parent ends.
func (f *filter) failed(pkg, test string, lines []string) {
	var block []string
	head := "--- FAIL: " + test + " ("
	for _, l := range lines {
		if strings.HasPrefix(l, head) {
			block = append(block, l)
		}
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, head) && !framing.MatchString(l) {
			block = append(block, l)
		}
	}
	i := strings.LastIndex(test, "/")
	if i < 0 {
		for _, l := range block {
			io.WriteString(f.out, l)
		}
		return
	}
	parent := test[:i]
	k := key(pkg, parent)
	if _, ok := f.pending[k]; !ok {
		f.order[pkg] = append(f.order[pkg], parent)
	}
	for _, l := range block {
		f.pending[k] = append(f.pending[k], "    "+l)
	}
}

func (f *filter) output(e event) {
	if e.Test == "" && strings.HasPrefix(e.Output, "FAIL\t") {
		f.anyFailed = true
	}
	if f.verbose {
		io.WriteString(f.out, e.Output)
		if e.Test == "" {
			return
		}
	}
	if e.Test == "" {
		// A lone PASS before "ok" is printed only under -v.
		if e.Output != "PASS\n" {
			io.WriteString(f.out, e.Output)
		}
		return
	}
	k := key(e.Package, e.Test)
	if _, ok := f.pending[k]; !ok {
		f.order[e.Package] = append(f.order[e.Package], e.Test)
	}
	f.pending[k] = append(f.pending[k], e.Output)
}

// packageEnd prints the output of the package's tests that never ended
// (a panic or a timeout ends the binary in the middle of them).
func (f *filter) packageEnd(pkg string) {
	for _, test := range f.order[pkg] {
		k := key(pkg, test)
		if lines, ok := f.pending[k]; ok && !f.verbose {
			f.print(lines)
		}
		delete(f.pending, k)
	}
	delete(f.order, pkg)
}

func (f *filter) print(lines []string) {
	for _, l := range lines {
		if !framing.MatchString(l) {
			io.WriteString(f.out, l)
		}
	}
}

// logLine is a t.Log line as the testing package writes it under -v:
// indented, "file.go:LINE: message".
var logLine = regexp.MustCompile(`^\s+[^\s:]+\.go:\d+: (.*)$`)

// reason is the last message a test logged before its "--- SKIP" line:
// t.Skip's own. Continuation lines of a multi-line message are joined.
func reason(lines []string) string {
	var msg []string
	for _, l := range lines {
		l = strings.TrimRight(l, "\n")
		if framing.MatchString(l) {
			continue
		}
		if m := logLine.FindStringSubmatch(l); m != nil {
			msg = []string{m[1]}
		} else if msg != nil && strings.TrimSpace(l) != "" {
			msg = append(msg, strings.TrimSpace(l))
		}
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " ")
}

// summary writes the skipped tests, one a line, package paths shortened
// to what follows the longest common prefix of module paths.
func summary(w io.Writer, skips []Skip) {
	if len(skips) == 0 {
		return
	}
	sort.SliceStable(skips, func(i, j int) bool {
		if skips[i].Package != skips[j].Package {
			return skips[i].Package < skips[j].Package
		}
		return skips[i].Test < skips[j].Test
	})
	prefix := modulePrefix(skips)
	width := 0
	for _, s := range skips {
		width = max(width, len(strings.TrimPrefix(s.Package, prefix)))
	}
	noun := "tests"
	if len(skips) == 1 {
		noun = "test"
	}
	fmt.Fprintf(w, "skipped %d %s (go test -v shows each one's log):\n", len(skips), noun)
	for _, s := range skips {
		fmt.Fprintf(w, "  %-*s  %s: %s\n", width, strings.TrimPrefix(s.Package, prefix), s.Test, s.Reason)
	}
}

// modulePrefix is the part of the packages' import paths up to and
// including the module's last element, when they all share one of the
// form host/owner/name/.
func modulePrefix(skips []Skip) string {
	p := strings.SplitAfterN(skips[0].Package, "/", 4)
	if len(p) < 4 {
		return ""
	}
	prefix := strings.Join(p[:3], "")
	for _, s := range skips {
		if !strings.HasPrefix(s.Package, prefix) {
			return ""
		}
	}
	return prefix
}

// verboseFlag reports whether go test's arguments ask for -v.
func verboseFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			break
		}
		switch a {
		case "-v", "--v", "-v=true", "--v=true", "-test.v", "-test.v=true":
			return true
		}
	}
	return false
}

func run(r io.Reader, w io.Writer, verbose bool) ([]Skip, error) {
	f := newFilter(w, verbose)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	for sc.Scan() {
		f.line(sc.Bytes())
	}
	// Whatever never ended (go test killed): print it.
	pkgs := make([]string, 0, len(f.order))
	for p := range f.order {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		f.packageEnd(p)
	}
	if f.anyFailed {
		io.WriteString(w, "FAIL\n")
	}
	return f.skips, sc.Err()
}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		skips, err := run(os.Stdin, os.Stdout, false)
		summary(os.Stdout, skips)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
			os.Exit(2)
		}
		return
	}
	if args[0] == "-h" || args[0] == "--help" {
		fmt.Println("usage: testsummary go test -json [flags] [packages]\n       go test -json ... | testsummary")
		return
	}
	// A ^C reaches go test too (same process group); keep reading until it
	// has said what it has to say.
	signal.Ignore(os.Interrupt)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(2)
	}
	skips, readErr := run(stdout, os.Stdout, verboseFlag(args))
	if readErr != nil {
		io.Copy(io.Discard, stdout)
	}
	err = cmd.Wait()
	summary(os.Stdout, skips)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code := exit.ExitCode()
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal()) // as a shell reports it
		}
		os.Exit(code)
	case err != nil:
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(2)
	case readErr != nil:
		fmt.Fprintf(os.Stderr, "testsummary: reading go test's output: %v\n", readErr)
		os.Exit(2)
	}
}
