//go:build reliability

package reliability

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pidnsEnv makes a test the helper that runs as PID 1 of a new PID
// namespace; its value is the file the helper writes its summary to.
const pidnsEnv = "KC_REL_PIDNS"

func inPIDNS() bool { return os.Getenv(pidnsEnv) != "" }

// runInPIDNS runs the test named name again, in this test binary, as PID 1
// of a new PID and mount namespace (killing it kills everything in the
// namespace), and decodes the summary it writes into out. Inside, the test
// must call pidnsSetup and then finishPIDNS.
func runInPIDNS(t *testing.T, name string, timeout time.Duration, out any, env ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a new PID namespace and ns_last_pid")
	}
	bins := binaries(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+name+"$", "-test.count=1", "-test.v", "-test.timeout="+(timeout+30*time.Second).String())
	cmd.Env = append(os.Environ(), pidnsEnv+"="+summary, binEnv+"="+bins)
	cmd.Env = append(cmd.Env, env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Setpgid:    true,
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(timeout + time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("helper in the PID namespace timed out; output:\n%s", buf.String())
	}
	if testing.Verbose() {
		t.Logf("helper output:\n%s", buf.String())
	}
	if err != nil {
		t.Fatalf("helper in the PID namespace failed: %v; output:\n%s", err, buf.String())
	}
	data, err := os.ReadFile(summary)
	if err != nil {
		t.Fatalf("no summary from the helper: %v; output:\n%s", err, buf.String())
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatal(err)
	}
}

// pidnsSetup prepares the helper: PID 1 of its namespace, with a private
// /proc showing that namespace.
func pidnsSetup(t *testing.T) {
	if os.Getpid() != 1 {
		t.Fatalf("helper is pid %d, not 1 of a new PID namespace", os.Getpid())
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount proc: %v", err)
	}
}

// finishPIDNS writes the helper's summary for the parent.
func finishPIDNS(t *testing.T, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(pidnsEnv), data, 0o600); err != nil {
		t.Fatal(err)
	}
}
