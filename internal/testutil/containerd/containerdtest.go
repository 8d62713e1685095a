// Package containerdtest gives tests a containerd to run containers in:
// the private containerd that .ci/lib/containerd.sh starts (its socket in
// KC_TEST_CONTAINERD_ADDRESS), a busybox image built here as an OCI
// archive (no registry is reachable) and imported with `ctr images
// import`, and `ctr` wrappers that clean up after the test.
//
// Import it from _test.go files only.
package containerdtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// AddressEnv names the private containerd's socket.
const AddressEnv = "KC_TEST_CONTAINERD_ADDRESS"

// cmdTimeout bounds every ctr call, so a wedged containerd fails the test
// instead of hanging it.
const cmdTimeout = 2 * time.Minute

// Address returns the private containerd's socket. The test is skipped
// when none is configured, and fails instead under KC_E2E=1, where every
// real component must be there.
func Address(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(AddressEnv)
	if addr == "" {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatalf("KC_E2E=1 but %s is unset: start a private containerd (.ci/lib/containerd.sh)", AddressEnv)
		}
		t.Skipf("%s unset: no private containerd (source .ci/lib/containerd.sh; start_containerd)", AddressEnv)
	}
	if _, err := exec.LookPath("ctr"); err != nil {
		t.Fatalf("%s is set but ctr is not on PATH: %v", AddressEnv, err)
	}
	return addr
}

// Ctr runs `ctr -a addr -n ns args...` and returns its stdout; a failure
// fails the test.
func Ctr(t testing.TB, addr, ns string, args ...string) string {
	t.Helper()
	out, err := TryCtr(addr, ns, nil, args...)
	if err != nil {
		t.Fatalf("ctr -n %s %s: %v", ns, strings.Join(args, " "), err)
	}
	return out
}

// TryCtr is Ctr returning the error; stdin (may be nil) feeds the command.
func TryCtr(addr, ns string, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"-a", addr, "-n", ns}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &cmdError{err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.stderr }
func (e *cmdError) Unwrap() error { return e.err }

// ImportImage imports the busybox image into namespace ns (creating the
// namespace) and returns its name.
func ImportImage(t testing.TB, addr, ns string) string {
	t.Helper()
	archive, err := Archive()
	if err != nil {
		t.Fatalf("building the busybox image: %v", err)
	}
	if _, err := TryCtr(addr, ns, archive, "images", "import", "-"); err != nil {
		t.Fatalf("ctr -n %s images import: %v", ns, err)
	}
	return ImageName
}

// Run starts a container with the busybox image in namespace ns
// (`ctr run -d`), with extra ctr run flags before the image, and removes
// it (task killed, container deleted) when the test ends. It returns the
// task's host PID.
func Run(t testing.TB, addr, ns, id string, flags []string, argv ...string) int {
	t.Helper()
	image := ImportImage(t, addr, ns)
	args := append([]string{"run", "-d", "--null-io"}, flags...)
	args = append(args, image, id)
	args = append(args, argv...)
	t.Cleanup(func() { Remove(addr, ns, id) })
	Ctr(t, addr, ns, args...)
	return TaskPID(t, addr, ns, id)
}

// TaskPID returns the PID `ctr tasks ls` shows for id's task.
func TaskPID(t testing.TB, addr, ns, id string) int {
	t.Helper()
	out := Ctr(t, addr, ns, "tasks", "ls")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("ctr tasks ls: bad PID in %q", line)
			}
			return pid
		}
	}
	t.Fatalf("ctr -n %s tasks ls has no task %s:\n%s", ns, id, out)
	return 0
}

// Kill SIGKILLs id's task and waits until it has stopped.
func Kill(t testing.TB, addr, ns, id string) {
	t.Helper()
	Ctr(t, addr, ns, "tasks", "kill", "-s", "KILL", id)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out := Ctr(t, addr, ns, "tasks", "ls")
		stopped := true
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == id && f[2] != "STOPPED" {
				stopped = false
			}
		}
		if stopped {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("task %s did not stop within 30s of SIGKILL", id)
}

// Remove kills and deletes id's task and deletes the container, ignoring
// errors (it may be gone already).
func Remove(addr, ns, id string) {
	_, _ = TryCtr(addr, ns, nil, "tasks", "kill", "-s", "KILL", id)
	for range 100 {
		if _, err := TryCtr(addr, ns, nil, "tasks", "rm", "-f", id); err == nil || strings.Contains(err.Error(), "not found") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _ = TryCtr(addr, ns, nil, "containers", "rm", id)
	RemoveNamespaceCgroups(ns)
}

// RemoveNamespaceCgroups removes the cgroup directories runc made for
// namespace ns under each hierarchy (/sys/fs/cgroup/<ns>, …/<ctrl>/<ns>):
// containerd removes a container's, never its namespace's. One still in
// use (another container of ns) stays.
func RemoveNamespaceCgroups(ns string) {
	if ns == "" || strings.ContainsAny(ns, "/.") {
		return
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + ns)
	for _, d := range append(dirs, "/sys/fs/cgroup/"+ns) {
		_ = syscall.Rmdir(d)
	}
}
