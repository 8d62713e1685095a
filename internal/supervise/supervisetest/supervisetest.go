// Package supervisetest holds helpers for tests of the supervise layer:
// building the real kc-hook binary (the wrapper must run as its own
// process: it signals its whole process group), polling for conditions,
// and killing process groups by identity on cleanup.
package supervisetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
)

// KCHookPackage is the import path of the hook binary.
const KCHookPackage = "github.com/kc-watchman/kc-watchman/cmd/kc-hook"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// BuildKCHook builds cmd/kc-hook (CGO_ENABLED=0) once per test binary into
// a temporary directory, as a binary named exactly "kc-hook" so that the
// wrapper's comm is trees.WrapperComm, and returns its path. The directory
// is shared by the test binary's tests; RemoveBuild (from TestMain)
// removes it, and otherwise the next build removes directories of test
// binaries that have exited.
func BuildKCHook(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildDir, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("build kc-hook: %v", buildErr)
	}
	return filepath.Join(buildDir, "kc-hook")
}

// RemoveBuild removes the directory BuildKCHook built into, if any.
func RemoveBuild() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

const buildDirPrefix = "kc-supervisetest-"

func build() (string, error) {
	removeStaleBuilds()
	dir, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "build", "-tags", "remote containers_image_openpgp", "-o", filepath.Join(dir, "kc-hook"), KCHookPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build %s: %v: %s", KCHookPackage, err, strings.TrimSpace(stderr.String()))
	}
	return dir, nil
}

// removeStaleBuilds deletes build directories whose test binary is gone.
func removeStaleBuilds() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*"))
	for _, m := range matches {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(m), buildDirPrefix), "-")
		if !ok || pidStr == strconv.Itoa(os.Getpid()) {
			continue
		}
		if _, err := os.Stat("/proc/" + pidStr); os.IsNotExist(err) {
			os.RemoveAll(m)
		}
	}
}

// Eventually polls cond every 10ms until it returns true or timeout
// passes, then fails t with msg.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("after %v: %s", timeout, msg)
	}
}

// Within polls cond every 10ms for up to timeout and reports whether it
// became true.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Dead reports whether the process is gone or a zombie (PID 1 on these
// machines reaps orphans lazily).
func Dead(st fingerprint.Stat) bool {
	return !fingerprint.Alive(fingerprint.DefaultRoot, st)
}

// KillGroups registers a cleanup that SIGKILLs, by pinned identity, every
// live member of the groups that the function returns at cleanup time,
// plus the listed processes.
func KillGroups(t testing.TB, groups func() []int, procs ...fingerprint.Stat) {
	t.Cleanup(func() {
		var ms []fingerprint.Stat
		if gs := groups(); len(gs) > 0 {
			ms = supervise.GroupMembers(fingerprint.DefaultRoot, gs...)
		}
		for _, m := range append(ms, procs...) {
			KillProcess(m)
		}
	})
}

// KillProcess SIGKILLs st if it is still that process.
func KillProcess(st fingerprint.Stat) {
	pin, err := fingerprint.Pin(fingerprint.DefaultRoot, st)
	if err != nil {
		return
	}
	defer pin.Close()
	pin.Signal(syscall.SIGKILL) //nolint:errcheck // best effort in cleanup
}

// Process starts argv as a child in its own process group (so signals to
// the test's group never reach it, nor the other way round), registers its
// SIGKILL and reaping on cleanup, and returns its identity.
func Process(t testing.TB, argv ...string) (*exec.Cmd, fingerprint.Stat) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // exit status is not the point
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid)
	if err != nil {
		t.Fatalf("read stat of %d: %v", cmd.Process.Pid, err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // it may be gone
		<-done
	})
	return cmd, st
}
