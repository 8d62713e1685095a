package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

const nobodyUID = 65534

// userTmp is a private directory as /tmp is (world-writable, sticky), for
// another user's sockets.
func userTmp(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kcb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o1777); err != nil {
		t.Fatal(err)
	}
	return d
}

// runMeasured runs the built kc-janitor and returns its exit code, its
// output, its peak RSS (bytes) and its wall time.
func runMeasured(t *testing.T, args ...string) (int, string, int64, time.Duration) {
	t.Helper()
	cmd := exec.Command(janitorBinary(t), args...)
	cmd.Env = append(os.Environ(), "KC_STATE_DIR="+t.TempDir())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return code, out.String(), ru.Maxrss << 10, took
}

// TestFatAnswersMemory: another user's 32 sockets answering /status and
// /sessions with 32 MiB bodies keep kc-janitor sweep and cull (32
// supervisors) under 200 MiB of peak RSS, below the shipped units'
// MemoryMax=256M; the answers are refused as over their caps (or, for
// cull, the budget they share), not read.
// (Before the caps, sweep peaked at 2.4 GB here.)
func TestFatAnswersMemory(t *testing.T) {
	const (
		n      = 32
		size   = 32 << 20
		maxRSS = 200 << 20
	)
	dir := userTmp(t)
	testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: 3100000, Size: size, UID: nobodyUID})

	code, out, rss, took := runMeasured(t, "sweep", "--socket-dir", dir, "--format", "json")
	t.Logf("FIGURE sweep of %d fat /status answers: peak RSS %d MiB, %v, exit %d", n, rss>>20, took.Round(time.Millisecond), code)
	if code != 0 {
		t.Errorf("sweep exit %d: %s", code, out)
	}
	if rss > maxRSS {
		t.Errorf("sweep peak RSS %d MiB, want under %d MiB", rss>>20, maxRSS>>20)
	}
	if !strings.Contains(out, "answer over 1048576 bytes") {
		t.Errorf("sweep does not say the answers were over the cap: %.2000s", out)
	}

	args := []string{"cull", "--format", "json"}
	for i := 0; i < n; i++ {
		args = append(args, "--socket", filepath.Join(dir, fmt.Sprintf("kc-%d.sock", 3100000+i)))
	}
	code, out, rss, took = runMeasured(t, args...)
	t.Logf("FIGURE cull of %d fat /sessions answers: peak RSS %d MiB, %v, exit %d", n, rss>>20, took.Round(time.Millisecond), code)
	if code != exitFailed {
		t.Errorf("cull exit %d, want %d (every supervisor unreadable): %.2000s", code, exitFailed, out)
	}
	if rss > maxRSS {
		t.Errorf("cull peak RSS %d MiB, want under %d MiB", rss>>20, maxRSS>>20)
	}
	// Sent without a length, the answers are charged as they come: one
	// that reaches the cap is refused as over it, one that cannot have
	// more of the budget while the others hold it gives up first. Which
	// of the two each meets depends on timing; neither is read in full.
	if !strings.Contains(out, "answer over 16777216 bytes") && !strings.Contains(out, "larger than the memory left to read it in") {
		t.Errorf("cull does not say the answers were over the cap or the budget: %.2000s", out)
	}
}

// TestSweepDeadlineFlag: --sweep-deadline bounds kc-janitor sweep over
// another user's 640 hung sockets; unprobed ones are kept and the run
// exits 0. (Before the deadline, 640 such sockets took 50 s.)
func TestSweepDeadlineFlag(t *testing.T) {
	const n = 640
	dir := userTmp(t)
	testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: 3200000, UID: nobodyUID})
	code, out, rss, took := runMeasured(t, "sweep", "--socket-dir", dir, "--apply", "--sweep-deadline", "2s")
	t.Logf("FIGURE sweep --apply of %d distinct hung sockets, --sweep-deadline 2s: %v, peak RSS %d MiB, exit %d", n, took.Round(time.Millisecond), rss>>20, code)
	if code != 0 {
		t.Errorf("exit %d: %.2000s", code, out)
	}
	if took > 5*time.Second {
		t.Errorf("sweep took %v with a 2s deadline", took)
	}
	if !strings.Contains(out, "not probed before the sweep deadline") {
		t.Errorf("the report does not say sockets were left unprobed: %.2000s", out)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Errorf("%d of %d hung sockets left: none may be unlinked", len(ents), n)
	}
}
