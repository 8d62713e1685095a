package kubernetes

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kc-watchman/kc-watchman/internal/podmantest"
	"github.com/kc-watchman/kc-watchman/internal/testkit"
)

// TestImageInitContainer builds the image from the Containerfile, offline
// and FROM scratch, in a private podman store (gone with the test), and
// runs the DaemonSet's init container as the manifest writes it: its
// command and args, its hostPath volumes mapped under a temp host root.
// kc-hook and the base spec naming it must land on that "node".
func TestImageInitContainer(t *testing.T) {
	e := podmantest.New(t)
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.TempDir()
	files := map[string]string{
		testkit.Build(t, testkit.KCJanitorPackage, "kc-janitor"): "bin/kc-janitor",
		testkit.Build(t, testkit.KCHookPackage, "kc-hook"):       "bin/kc-hook",
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
		if err := testkit.CopyFile(src, dst, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var b [6]byte
	rand.Read(b[:])
	image := "localhost/kc-watchman-test:" + hex.EncodeToString(b[:])
	if out, err := e.Podman("build", "--pull=never", "-f", filepath.Join(repo, "contrib/kubernetes/Containerfile"), "-t", image, ctx); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

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

	// The entrypoint runs with no shell in the image.
	out, err := e.Podman("run", "--rm", "--network", "none", image, "version")
	if err != nil || !strings.Contains(out, "kc-janitor") {
		t.Errorf("kc-janitor version in the image: %q %v", out, err)
	}
	if out, err := e.Podman("rmi", image); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
}
