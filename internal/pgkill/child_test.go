package pgkill_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
)

// RunOwnGroup kills what the child left in its group, whether the child
// exited or overstayed, and nothing that left the group (a setsid'd
// process is another group: not its to kill).
func TestRunOwnGroup(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		timedOut     bool
		survives     bool // the child's child must outlive the run
	}{
		{name: "exits leaving a child", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; exit 0"},
		{name: "overstays", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; wait", timedOut: true},
		// The child writes its PID once setsid has moved it out of the group.
		{name: "a child in its own session", script: "setsid sh -c 'echo $$ >\"$1\"; exec sleep 600' sh \"$1\" </dev/null >/dev/null 2>&1 & while [ ! -s \"$1\" ]; do :; done; exit 0", survives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "child")
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			timedOut, err := pgkill.RunOwnGroup(ctx, exec.Command("/bin/sh", "-c", tc.script, "sh", pidFile))
			if timedOut != tc.timedOut {
				t.Errorf("timedOut = %v (err %v), want %v", timedOut, err, tc.timedOut)
			}
			pid := readPID(t, pidFile)
			defer syscall.Kill(pid, syscall.SIGKILL)
			if tc.survives {
				if !fingerprint.Running(fingerprint.DefaultRoot, pid) {
					t.Errorf("the child %d in its own session was killed", pid)
				}
				return
			}
			for deadline := time.Now().Add(5 * time.Second); fingerprint.Running(fingerprint.DefaultRoot, pid); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the child %d outlived the run", pid)
				}
			}
		})
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
