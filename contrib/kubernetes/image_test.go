package kubernetes

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// TestImageInitContainer builds the image from the Containerfile, offline
// and FROM scratch, in a private podman store (gone with the test), and
// runs the DaemonSet's init container as the manifest writes it: its
// command and args, its hostPath volumes mapped under a temp host root.
// kc-hook and the base spec naming it must land on that "node".
func TestImageInitContainer(t *testing.T) {
	e := podmantest.New(t)
	image, ctx := buildImage(t, e)

	ds, _ := janitor(t)
	spec := ds.Spec.Template.Spec
	var init *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "install-hook" {
			init = &spec.InitContainers[i]
		}
	}
	if init == nil {
		t.Fatal("no init container install-hook")
	}
	host := t.TempDir()
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	args := []string{"run", "--rm", "--network", "none"}
	for _, m := range init.VolumeMounts {
		p, ok := hostPaths[m.Name]
		if !ok {
			t.Fatalf("init container mounts %s, not a hostPath", m.Name)
		}
		if err := os.MkdirAll(filepath.Join(host, p), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-v", filepath.Join(host, p)+":"+m.MountPath)
	}
	if len(init.Command) > 0 {
		args = append(args, "--entrypoint", init.Command[0])
	}
	args = append(args, image)
	if len(init.Command) > 1 {
		args = append(args, init.Command[1:]...)
	}
	args = append(args, init.Args...)
	if out, err := e.Podman(args...); err != nil {
		t.Fatalf("the init container: %v\n%s", err, out)
	}

	want, err := os.ReadFile(filepath.Join(ctx, "bin/kc-hook"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(host, "opt/kc-watchman/kc-hook"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("kc-hook not installed on the node (%v)", err)
	}
	data, err := os.ReadFile(filepath.Join(host, "etc/containerd/kc-watchman-base-spec.json"))
	if err != nil {
		t.Fatal(err)
	}
	var bs struct {
		Hooks map[string][]struct{ Path string } `json:"hooks"`
	}
	if err := json.Unmarshal(data, &bs); err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"createRuntime", "poststop"} {
		if len(bs.Hooks[stage]) != 1 || bs.Hooks[stage][0].Path != "/opt/kc-watchman/kc-hook" {
			t.Errorf("base spec %s hooks %+v, want the node's /opt/kc-watchman/kc-hook", stage, bs.Hooks[stage])
		}
	}

	// A CRI-O node (README.md, "CRI-O nodes"): the image's descriptors,
	// naming the node's kc-hook, in CRI-O's hooks dir.
	crio := filepath.Join(host, "etc/containers/oci/hooks.d")
	if err := os.MkdirAll(crio, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := e.Podman("run", "--rm", "--network", "none", "-v", filepath.Join(host, "opt/kc-watchman")+":/host/opt/kc-watchman",
		"-v", crio+":/host/etc/containers/oci/hooks.d", image,
		"install-hook", "--to", "/host/opt/kc-watchman", "--hook-path", "/opt/kc-watchman/kc-hook", "--hooks-dir", "/host/etc/containers/oci/hooks.d"); err != nil {
		t.Fatalf("the init container, CRI-O's way: %v\n%s", err, out)
	}
	for _, stage := range []string{"createruntime", "poststop"} {
		var d struct {
			Hook   struct{ Path string } `json:"hook"`
			Stages []string              `json:"stages"`
		}
		data, err := os.ReadFile(filepath.Join(crio, "kc-hook-"+stage+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &d); err != nil || d.Hook.Path != "/opt/kc-watchman/kc-hook" || !strings.EqualFold(strings.Join(d.Stages, ","), stage) {
			t.Errorf("descriptor for %s: %+v %v", stage, d, err)
		}
	}

	// The entrypoint runs with no shell in the image.
	out, err := e.Podman("run", "--rm", "--network", "none", image, "version")
	if err != nil || !strings.Contains(out, "kc-janitor") {
		t.Errorf("kc-janitor version in the image: %q %v", out, err)
	}
	if out, err := e.Podman("rmi", image); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
}

// buildImage builds the image from the Containerfile into e's store,
// from a context of freshly built binaries and the repository's files.
func buildImage(t *testing.T, e *podmantest.Env) (image, ctx string) {
	t.Helper()
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx = t.TempDir()
	files := map[string]string{
		testutil.Build(t, testutil.KCJanitorPackage, "kc-janitor"): "bin/kc-janitor",
		testutil.Build(t, testutil.KCHookPackage, "kc-hook"):       "bin/kc-hook",
	}
	for _, dir := range []string{"hooks.d", "contrib/containerd"} {
		entries, err := os.ReadDir(filepath.Join(repo, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			files[filepath.Join(repo, dir, en.Name())] = filepath.Join(dir, en.Name())
		}
	}
	for src, rel := range files {
		dst := filepath.Join(ctx, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := testutil.CopyFile(src, dst, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var b [6]byte
	rand.Read(b[:])
	image = "localhost/kc-watchman-test:" + hex.EncodeToString(b[:])
	if out, err := e.Podman("build", "--pull=never", "-f", filepath.Join(repo, "contrib/kubernetes/Containerfile"), "-t", image, ctx); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	return image, ctx
}

// TestImageJanitor runs the image's janitor as the DaemonSet runs it:
// hostPID, host network, privileged, the manifest's args and env (the
// pod's IP resolved, the port the kernel's), its hostPath volumes mapped
// under a temp host root but /run/containerd, which is the private
// containerd's. A round must finish with containerd's ground truth known,
// and the probes' endpoints answer.
func TestImageJanitor(t *testing.T) {
	addr := containerdtest.Address(t)
	e := podmantest.New(t)
	image, _ := buildImage(t, e)
	_, c := janitor(t)
	id := runJanitorImage(t, e, image, addr, nil)
	logs := waitRound(t, e, id, `"msg":"cull"`)
	if strings.Contains(logs, "ground truth unknown") {
		t.Errorf("containerd was not asked successfully:\n%s", logs)
	}
	probe(t, c, servingAddr(t, logs))
	if out, err := e.Podman("stop", "-t", "30", id); err != nil {
		t.Errorf("stop: %v\n%s", err, out)
	}
	if code, err := e.Podman("inspect", "-f", "{{.State.ExitCode}}", id); err != nil || code != "143" {
		t.Errorf("exit %q (%v) after SIGTERM, want 143", code, err)
	}
	// The same image (one build per test run: each takes most of a
	// minute here).
	t.Run("reaps a dead container's tree", func(t *testing.T) { reapsDeadTree(t, e, image, addr) })
}

// reapsDeadTree: the image's janitor, run as the DaemonSet runs it,
// reports the tree of a containerd container that was removed as
// would-reap in audit mode, and reaps it with KC_RECONCILE_APPLY=1. Its reconcile is scoped to that container
// (KC_RECONCILE_CONTAINERS) and a supervisor name of this test's own:
// other tests' trees on this machine are never its to reap.
func reapsDeadTree(t *testing.T, e *podmantest.Env, image, addr string) {
	var b [32]byte
	rand.Read(b[:])
	dead := hex.EncodeToString(b[:])
	containerdtest.Run(t, addr, "kc-image", dead, nil, "/bin/sleep", "600")
	const comm = "kcsrv-image"
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: dead, Comm: comm, Children: 1})
	containerdtest.Kill(t, addr, "kc-image", dead)
	containerdtest.Ctr(t, addr, "kc-image", "tasks", "rm", dead)
	containerdtest.Ctr(t, addr, "kc-image", "containers", "rm", dead)
	scope := []string{"KC_RECONCILE_CONTAINERS=" + dead, "KC_SUPERVISOR_COMM=" + comm, "KC_MIN_AGE=0s"}

	audit := runJanitorImage(t, e, image, addr, scope)
	logs := waitRound(t, e, audit, "would-reap")
	if !strings.Contains(logs, fmt.Sprint(k.PGID)) {
		t.Errorf("the audit round does not name the tree %d:\n%s", k.PGID, logs)
	}
	if _, err := e.Podman("rm", "-f", "-t", "0", audit); err != nil {
		t.Fatal(err)
	}
	if k.Cmd.ProcessState != nil {
		t.Fatal("the audit round touched the tree")
	}
	apply := runJanitorImage(t, e, image, addr, append(scope, "KC_RECONCILE_APPLY=1"))
	waitRound(t, e, apply, `"action":"reaped"`)
	select {
	case <-k.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the tree of the removed container is still alive after the janitor reaped it")
	}
}

// runJanitorImage starts the image's janitor container as the DaemonSet
// runs it: hostPID, host network, privileged, the manifest's args and env
// (the pod's IP resolved, the port the kernel's; extra appended), its
// hostPath volumes mapped under a temp host root but /run/containerd,
// which is the private containerd's at addr. It is removed at cleanup.
func runJanitorImage(t *testing.T, e *podmantest.Env, image, addr string, extra []string) string {
	t.Helper()
	ds, c := janitor(t)
	spec := ds.Spec.Template.Spec
	if !spec.HostPID || !spec.HostNetwork {
		t.Fatal("the janitor runs with hostPID and hostNetwork")
	}
	host := t.TempDir()
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	args := []string{"run", "-d", "--network", "host", "--pid", "host"}
	if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		args = append(args, "--privileged")
	}
	for _, m := range c.VolumeMounts {
		p, ok := hostPaths[m.Name]
		if !ok {
			t.Fatalf("janitor mounts %s, not a hostPath", m.Name)
		}
		src := filepath.Join(host, p)
		switch {
		case p == "/run/containerd":
			src = filepath.Dir(addr)
		case m.ReadOnly && p == "/sys/fs/cgroup":
			src = p // read only: the host's own, as on a node
		default:
			if err := os.MkdirAll(src, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opt := ""
		if m.ReadOnly {
			opt = ":ro"
		}
		args = append(args, "-v", src+":"+m.MountPath+opt)
	}
	for _, kv := range append(kubeletEnv(t, c, map[string]string{"KC_METRICS_LISTEN": "127.0.0.1:0"}), extra...) {
		args = append(args, "-e", kv)
	}
	args = append(args, image)
	args = append(args, c.Args...)
	id, err := e.Podman(args...)
	if err != nil {
		t.Fatalf("the janitor container: %v", err)
	}
	t.Cleanup(func() {
		if out, err := e.Podman("rm", "-f", "-t", "0", id); err != nil && !strings.Contains(out, "no such container") {
			t.Errorf("%v\n%s", err, out)
		}
	})
	return id
}

// waitRound waits up to a minute for the janitor container's logs to
// contain want, and returns them.
func waitRound(t *testing.T, e *podmantest.Env, id, want string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		logs, err := containerLogs(e, id)
		if err == nil && strings.Contains(logs, want) {
			return logs
		}
		if time.Now().After(deadline) {
			state, _ := e.Podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.Error}}", id)
			t.Fatalf("no %s in 60s (%v; container %s):\n%s", want, err, state, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// containerLogs is a container's stdout and stderr: podman logs writes
// the container's stderr, where the janitor logs, to its own stderr.
func containerLogs(e *podmantest.Env, id string) (string, error) {
	cmd := exec.Command(e.PodmanPath(), append(e.GlobalArgs(), "logs", id)...)
	cmd.Env = e.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman logs: %w", err)
	}
	return string(out), nil
}
