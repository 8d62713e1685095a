package pgkill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testkit/proc"
)

// killAsEnv makes the test binary a helper that runs Kill on the group
// given as JSON in the variable and prints the result as JSON.
const killAsEnv = "KC_PGKILL_KILL_HELPER"

type killReport struct {
	Outcome pgkill.Outcome
	Signals []syscall.Signal
	Err     string
}

// killHelper is run from TestMain.
func killHelper(spec string) int {
	var g pgkill.Group
	if err := json.Unmarshal([]byte(spec), &g); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res := pgkill.Kill(context.Background(), g, pgkill.Options{Grace: 100 * time.Millisecond, Poll: 5 * time.Millisecond, KillWait: time.Second})
	rep := killReport{Outcome: res.Outcome, Signals: res.Signals}
	if res.Err != nil {
		rep.Err = res.Err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// TestKillNotPermitted: an unprivileged caller cannot signal root's group;
// Kill must say so (would not die, EPERM) rather than report it gone.
func TestKillNotPermitted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the caller as another user")
	}
	cmds := []*exec.Cmd{sleepCmd(), sleepCmd()}
	g := startGroup(t, cmds...)
	spec, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}

	// A copy of this test binary that nobody (65534) may execute.
	dir, err := os.MkdirTemp("", "kc-pgkill-eperm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "pgkill.test")
	if err := copyFile(exe, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), killAsEnv+"="+string(spec))
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v; stderr: %s", err, exitStderr(err))
	}
	var rep killReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	if rep.Outcome != pgkill.WouldNotDie || len(rep.Signals) != 0 || !strings.Contains(rep.Err, "operation not permitted") {
		t.Errorf("Kill as uid 65534 = %+v; want would-not-die with EPERM, no signal", rep)
	}
	for _, st := range g.Members {
		now := proc.MustStat(t, root, st.PID)
		if !fingerprint.Alive(root, st) || now.State != 'S' {
			t.Errorf("member %d in state %c after a refused Kill", st.PID, now.State)
		}
	}
}

func copyFile(dst string, mode os.FileMode) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
