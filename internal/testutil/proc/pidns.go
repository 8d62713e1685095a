package proc

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// pidnsEnv marks the copy of a test binary that runs as PID 1 of a new PID
// namespace; its value is the file that copy writes its summary to.
const pidnsEnv = "KC_TEST_PIDNS_SUMMARY"

// InPIDNamespace reports whether this test binary is the copy
// RunInPIDNamespace started: the test must then call EnterPIDNamespace, do
// its trials and end with WriteSummary.
func InPIDNamespace() bool { return os.Getenv(pidnsEnv) != "" }

// RunInPIDNamespace runs the test named test again, in a copy of this test
// binary that is PID 1 of a new PID and mount namespace, with env added
// (killing it kills everything in the namespace, so nothing it starts can
// outlive it), and decodes the summary it writes into summary. There,
// /proc/sys/kernel/ns_last_pid hands out the PIDs, which is how tests make
// a PID be reused at will.
func RunInPIDNamespace(t *testing.T, test string, timeout time.Duration, summary any, env ...string) {
	t.Helper()
	summaryPath := filepath.Join(t.TempDir(), "summary.json")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+test+"$", "-test.count=1", "-test.v", "-test.timeout="+(timeout+30*time.Second).String())
	cmd.Env = append(append(os.Environ(), pidnsEnv+"="+summaryPath), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Setpgid:    true,
	}
	Start(t, cmd)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(timeout + time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("helper in the PID namespace timed out; output:\n%s", out.String())
	}
	if testing.Verbose() {
		t.Logf("helper output:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("helper in the PID namespace failed: %v; output:\n%s", err, out.String())
	}
	data, err := os.ReadFile(summaryPath)
	if err != nil {
		t.Fatalf("no summary from the helper: %v; output:\n%s", err, out.String())
	}
	if err := json.Unmarshal(data, summary); err != nil {
		t.Fatal(err)
	}
}

// EnterPIDNamespace prepares the copy RunInPIDNamespace started: it checks
// it is PID 1 of its namespace and mounts a private /proc that shows it.
func EnterPIDNamespace(t *testing.T) {
	t.Helper()
	if os.Getpid() != 1 {
		t.Fatalf("helper is pid %d, not 1 of a new PID namespace", os.Getpid())
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount proc: %v", err)
	}
	if st := MustStat(t, fingerprint.DefaultRoot, 1); st.PID != 1 || st.PPID != 0 {
		t.Fatalf("/proc does not show this namespace: %+v", st)
	}
}

// WriteSummary hands v to the test that started this copy.
func WriteSummary(t *testing.T, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(pidnsEnv), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// NamespaceInit starts a sleep as PID 1 of a new PID namespace (as a
// container's init is), its parent unshare(1) run under the name parent
// (a monitor's, "conmon"; "" for unshare's own), and returns its PID
// here; both are killed at cleanup. It skips t without unshare(1).
func NamespaceInit(t testing.TB, parent string) int {
	t.Helper()
	bin, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("no unshare(1): %v", err)
	}
	if parent != "" {
		named := filepath.Join(t.TempDir(), parent)
		if err := testutil.CopyFile(bin, named, 0o755); err != nil {
			t.Fatal(err)
		}
		bin = named
	}
	unshare := StartGroup(t, exec.Command(bin, "--pid", "--fork", "sleep", "1000"))
	children := filepath.Join("/proc", strconv.Itoa(unshare.Process.Pid), "task", strconv.Itoa(unshare.Process.Pid), "children")
	var pid int
	WaitFor(t, 10*time.Second, "the new PID namespace's init", func() bool {
		data, err := os.ReadFile(children)
		if f := strings.Fields(string(data)); err == nil && len(f) == 1 {
			pid, _ = strconv.Atoi(f[0])
			st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
			return err == nil && st.Comm == "sleep"
		}
		return false
	})
	return pid
}
