package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Import paths of the project's binaries, for Build.
const (
	KCHookPackage    = "github.com/kc-watchman/kc-watchman/cmd/kc-hook"
	KCJanitorPackage = "github.com/kc-watchman/kc-watchman/cmd/kc-janitor"
)

// builds caches one build per (package, name) per test binary: tests of a
// binary share the compiled programs. It is test scaffolding, not program
// state.
var builds struct {
	sync.Mutex
	dir  string
	done map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build compiles pkg with CGO_ENABLED=0 and the Makefile's tags into a
// temporary directory as a binary named name (so that its processes have
// comm name), once per test binary, and returns its path. A failed build
// fails t. The directory outlives the test (tests of the binary share it);
// RemoveBuilds removes it, and otherwise the next test binary that builds
// removes directories of test binaries that have exited.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	builds.Lock()
	if builds.done == nil {
		builds.done = map[string]*build{}
	}
	b := builds.done[pkg+" "+name]
	if b == nil {
		b = &build{}
		builds.done[pkg+" "+name] = b
	}
	builds.Unlock()
	b.once.Do(func() { b.path, b.err = compile(pkg, name) })
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return b.path
}

// RemoveBuilds removes what Build compiled; call it from TestMain after
// m.Run.
func RemoveBuilds() {
	builds.Lock()
	defer builds.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
		builds.dir = ""
		builds.done = nil
	}
}

// Main runs a test binary's tests, removes what Build compiled and exits
// with the tests' status. A package whose tests call Build (or
// StartKCServer) and has no other TestMain uses it as its TestMain:
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
//
// A package with a TestMain of its own calls RemoveBuilds (and
// RemoveContainParents, where its tests run kc-hook supervise) after
// m.Run.
func Main(m *testing.M) {
	code := m.Run()
	RemoveBuilds()
	RemoveContainParents()
	os.Exit(code)
}

const buildDirPrefix = "kc-testkit-build-"

func compile(pkg, name string) (string, error) {
	builds.Lock()
	if builds.dir == "" {
		removeStaleBuilds()
		dir, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(os.Getpid())+"-")
		if err != nil {
			builds.Unlock()
			return "", err
		}
		builds.dir = dir
	}
	sub, err := os.MkdirTemp(builds.dir, name+"-")
	builds.Unlock()
	if err != nil {
		return "", err
	}
	out := filepath.Join(sub, name)
	return out, GoBuild(pkg, out)
}

// BuildTags are the Makefile's TAGS.
const BuildTags = "urfave_cli_no_docs"

// GoBuild compiles pkg (an import path, or a directory relative to the
// working directory) into the binary out as the Makefile does:
// CGO_ENABLED=0, BuildTags. It is the one place tests, the reliability suite
// and the benchmark harness build the project's programs.
func GoBuild(pkg, out string) error {
	gobin, err := goTool()
	if err != nil {
		return err
	}
	cmd := exec.Command(gobin, "build", "-tags", BuildTags, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", errors.New("no go tool in PATH or GOROOT")
	}
	return p, nil
}

// removeStaleBuilds deletes build directories whose test binary is gone.
func removeStaleBuilds() {
	if os.Getpid() == 1 {
		// PID 1 of a PID namespace of its own (proc.RunInPIDNamespace):
		// the test binaries outside are not in this /proc, and their
		// builds are in use.
		return
	}
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*"))
	for _, m := range matches {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(m), buildDirPrefix), "-")
		if !ok || pidStr == strconv.Itoa(os.Getpid()) {
			continue
		}
		if _, err := os.Stat("/proc/" + pidStr); errors.Is(err, os.ErrNotExist) {
			os.RemoveAll(m)
		}
	}
}
