package podmantest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func TestRunStopPoststopHook(t *testing.T) {
	t.Parallel()
	e := New(t)

	// A poststop hook that saves the runtime state it gets on stdin. Hooks
	// run with an empty environment, hence the absolute paths.
	marker := filepath.Join(e.Dir(), "poststop.json")
	script := filepath.Join(e.Dir(), "marker-hook.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec /bin/cat > \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.WriteHook(t, "marker", script, []string{"marker-hook", marker}, nil, "poststop")

	start := time.Now()
	id := e.Run(t, "--name", "smoke", "--annotation", "kc.test=smoke")
	t.Logf("podman run -d: %v", time.Since(start))

	pid := e.InitPID(t, id)
	if pid <= 0 {
		t.Fatalf("InitPID = %d", pid)
	}
	argv, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatalf("init pid %d not alive: %v", pid, err)
	}
	if got := string(argv); got != "/bin/sleep\x00100000\x00" {
		t.Fatalf("init pid %d argv = %q, want /bin/sleep 100000", pid, got)
	}
	if proc.Dead(pid) {
		t.Fatalf("init pid %d is dead right after run", pid)
	}
	if s := e.State(t, id); s != "running" {
		t.Fatalf("State = %q, want running", s)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("poststop hook ran before stop")
	}

	start = time.Now()
	e.Stop(t, id)
	t.Logf("podman stop -t 0: %v", time.Since(start))

	proc.WaitFor(t, 10*time.Second, "init process to die", func() bool { return proc.Dead(pid) })
	proc.WaitFor(t, 10*time.Second, "poststop hook marker", func() bool {
		fi, err := os.Stat(marker)
		return err == nil && fi.Size() > 0
	})
	var state struct {
		ID          string            `json:"id"`
		Status      string            `json:"status"`
		Annotations map[string]string `json:"annotations"`
	}
	b, _ := os.ReadFile(marker)
	if err := json.Unmarshal(b, &state); err != nil {
		t.Fatalf("hook stdin %q: %v", b, err)
	}
	if state.ID != id || state.Status != "stopped" || state.Annotations["kc.test"] != "smoke" {
		t.Fatalf("hook got state %+v, want id %s, status stopped, annotation kc.test=smoke", state, id)
	}
	if s := e.State(t, id); s != "exited" && s != "stopped" {
		t.Fatalf("State after stop = %q", s)
	}

	start = time.Now()
	e.Remove(t, id)
	t.Logf("podman rm: %v", time.Since(start))
	if _, err := e.Podman("container", "exists", id); err == nil {
		t.Fatal("container still exists after Remove")
	}
}

func TestRunCommandAndEnviron(t *testing.T) {
	t.Parallel()
	e := New(t)
	id := e.Run(t, "--label", "kc=1", "--", "/bin/sh", "-c", "echo hello > /tmp/out; exec sleep 100000")
	proc.WaitFor(t, 10*time.Second, "container command to write /tmp/out", func() bool {
		out, err := e.Podman("exec", id, "cat", "/tmp/out")
		return err == nil && out == "hello"
	})

	// Plain "podman" with only Environ() — what code under test that execs
	// podman itself sees — reaches the same private setup.
	cmd := exec.Command(e.PodmanPath(), "ps", "--no-trunc", "--format", "{{.ID}}")
	cmd.Env = e.Environ()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman ps with Environ only: %v", err)
	}
	if strings.TrimSpace(string(out)) != id {
		t.Fatalf("podman ps with Environ only = %q, want %s", out, id)
	}
	e.Remove(t, id)
}

func get(t *testing.T, sock, path string) (string, error) {
	t.Helper()
	c := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := c.Get("http://d" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), errors.New(resp.Status)
	}
	return string(b), err
}

func TestStartStopAPI(t *testing.T) {
	t.Parallel()
	e := New(t)
	start := time.Now()
	url := e.StartAPI(t)
	t.Logf("StartAPI: %v", time.Since(start))
	if url != e.APIURL() || !strings.HasPrefix(url, "unix:///") {
		t.Fatalf("StartAPI = %q, APIURL = %q", url, e.APIURL())
	}
	sock := strings.TrimPrefix(url, "unix://")
	if got, err := get(t, sock, "/v4.0.0/libpod/_ping"); err != nil || got != "OK" {
		t.Fatalf("libpod _ping = %q, %v", got, err)
	}
	if again := e.StartAPI(t); again != url {
		t.Fatalf("second StartAPI = %q, want %q", again, url)
	}

	// The service sees containers made by the CLI: same storage.
	id := e.Run(t, "--name", "via-cli")
	body, err := get(t, sock, "/v4.0.0/libpod/containers/json")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		ID    string `json:"Id"`
		State string `json:"State"`
		Pid   int    `json:"Pid"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("containers/json %q: %v", body, err)
	}
	if len(list) != 1 || list[0].ID != id || list[0].State != "running" {
		t.Fatalf("API lists %+v, want only running %s", list, id)
	}

	e.StopAPI(t)
	if _, err := get(t, sock, "/_ping"); err == nil {
		t.Fatal("API still answers after StopAPI")
	}
	// The CLI still works with the API down.
	if s := e.State(t, id); s != "running" {
		t.Fatalf("State with API down = %q", s)
	}

	if again := e.StartAPI(t); again != url {
		t.Fatalf("StartAPI after StopAPI = %q, want %q", again, url)
	}
	if got, err := get(t, sock, "/_ping"); err != nil || got != "OK" {
		t.Fatalf("_ping after restart = %q, %v", got, err)
	}
}

func TestCleanupRemovesEverything(t *testing.T) {
	t.Parallel()
	var (
		dir, sock string
		pid       int
		apiPid    int
	)
	t.Run("env", func(t *testing.T) {
		e := New(t)
		dir = e.Dir()
		id := e.Run(t)
		pid = e.InitPID(t, id)
		sock = strings.TrimPrefix(e.StartAPI(t), "unix://")
		e.mu.Lock()
		apiPid = e.api.cmd.Process.Pid
		e.mu.Unlock()
	})
	if t.Skipped() || dir == "" {
		return
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Env dir %s still there after cleanup: %v", dir, err)
	}
	if !proc.Dead(pid) {
		t.Errorf("container init pid %d still alive after cleanup", pid)
	}
	if !proc.Dead(apiPid) {
		t.Errorf("API service pid %d still alive after cleanup", apiPid)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Errorf("API socket %s still there", sock)
	}
	// Nothing of the Env keeps running (conmon, container cleanup).
	e := &Env{dir: dir}
	if left := e.procsUsingDir(); len(left) > 0 {
		t.Errorf("processes still using %s: %v", dir, left)
	}
	if err := syscall.Kill(pid, 0); err == nil && !proc.Dead(pid) {
		t.Errorf("pid %d alive", pid)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a`:          "/tmp/a",
		`/tmp/a\040b`:     "/tmp/a b",
		`/tmp/x\134y\011`: "/tmp/x\\y\t",
		`/tmp/bad\04`:     `/tmp/bad\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReapStaleEnv(t *testing.T) {
	t.Parallel()
	if err := Requirements(); err != nil {
		New(t) // skips or fails as New does
	}
	bb, _ := staticBusybox()
	podman, _ := lookTool("podman")
	// An Env whose test binary died: laid out, a container running, an
	// owner file that nobody holds a lock on.
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	e := envAt(podman, dir)
	t.Cleanup(func() { e.teardown(t.Logf) })
	if err := e.layout(bb); err != nil {
		t.Fatal(err)
	}
	id := e.Run(t)
	pid := e.InitPID(t, id)
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A live Env next to it must survive the reaping.
	live := New(t)
	liveID := live.Run(t)

	reapStaleEnvs(podman, t.Logf)

	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale dir %s not reaped: %v", dir, err)
	}
	proc.WaitFor(t, 10*time.Second, "stale container's init to die", func() bool { return proc.Dead(pid) })
	if s := live.State(t, liveID); s != "running" {
		t.Errorf("live Env's container is %q after reaping", s)
	}
}

// A container that exits by itself gets its poststop hooks from conmon's
// "podman container cleanup", with the hooks fixed at create time: the
// descriptor may be gone by then.
func TestPoststopHookOnSelfExit(t *testing.T) {
	t.Parallel()
	e := New(t)
	marker := filepath.Join(e.Dir(), "exited.json")
	script := filepath.Join(e.Dir(), "marker-hook.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec /bin/cat > \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	desc := e.WriteHook(t, "marker", script, []string{"marker-hook", marker}, nil, "poststop")
	id := e.Run(t, "--", "/bin/sleep", "1")
	if err := os.Remove(desc); err != nil {
		t.Fatal(err)
	}
	proc.WaitFor(t, 20*time.Second, "poststop hook after the container exited by itself", func() bool {
		b, err := os.ReadFile(marker)
		return err == nil && bytes.Contains(b, []byte(id))
	})
}
