// Package cri runs kc-hook the way a Kubernetes node with containerd runs
// it: containerd's CRI plugin, configured with contrib/containerd's
// config snippet and base_runtime_spec, creates a pod sandbox and a
// container through the CRI gRPC API, and stopping the container runs
// kc-hook's poststop from the spec.
package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuilds()
	os.Exit(code)
}

const hookInstallPath = "/usr/local/libexec/oci/hooks.d/kc-hook"

// baseSpec returns contrib/containerd's base spec with the hook's path
// rewritten to the kc-hook built for this test and its state dir set, as
// an installation would (the shipped file names the install path).
func baseSpec(t *testing.T, hook, stateDir string) []byte {
	t.Helper()
	data, err := os.ReadFile("../../contrib/containerd/base-runtime-spec.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("base-runtime-spec.json: %v", err)
	}
	hooks := spec["hooks"].(map[string]any)
	for _, stage := range []string{"createRuntime", "poststop"} {
		hs, _ := hooks[stage].([]any)
		if len(hs) != 1 {
			t.Fatalf("base spec: want one %s hook, got %v", stage, hooks[stage])
		}
		h := hs[0].(map[string]any)
		if h["path"] != hookInstallPath {
			t.Fatalf("base spec %s hook path %v is not the documented install path", stage, h["path"])
		}
		h["path"] = hook
		h["env"] = append([]any{"KC_STATE_DIR=" + stateDir, "KC_KILL_GRACE=1s"}, h["env"].([]any)...)
	}
	out, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// criContainerd starts a containerd of its own with the CRI plugin on,
// configured with the shipped snippet, and returns its socket. extra is
// appended to the configuration (more runtime handlers).
func criContainerd(t *testing.T, specPath string, extra ...string) string {
	t.Helper()
	containerdtest.Address(t) // skip or fail like every containerd test
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Fatalf("no containerd binary: %v", err)
	}
	// Short: the socket path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "kc-cri.")
	if err != nil {
		t.Fatal(err)
	}
	snippet, err := os.ReadFile("../../contrib/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped snippet, with the spec path of this test, under the
	// settings that make the daemon private to the test.
	conf := strings.ReplaceAll(string(snippet), "/etc/containerd/kc-watchman-base-spec.json", specPath)
	conf = fmt.Sprintf(`root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # These machines deny lowering oom_score_adj (runc: "failed to update
  # /proc/self/oom_score_adj: Permission denied" for the sandbox's -998):
  # keep every container's at or above containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "c.sock"), filepath.Join(dir, "c.sock.ttrpc"),
		containerdtest.ImageName, filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf")) + conf + strings.Join(extra, "\n")
	// version = 2 must come first in the file.
	conf = "version = 2\n" + strings.ReplaceAll(conf, "version = 2\n", "")
	confPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", confPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	t.Cleanup(func() {
		for _, ns := range []string{"k8s.io"} {
			out, _ := containerdtest.TryCtr(sock, ns, nil, "tasks", "ls", "-q")
			for _, id := range strings.Fields(out) {
				containerdtest.Remove(sock, ns, id)
			}
		}
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log (tail):\n%s", tail(string(b), 40))
			}
		}
		unmountUnder(dir)
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := containerdtest.TryCtr(sock, "default", nil, "version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd with CRI did not answer within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := containerdtest.Ctr(t, sock, "default", "plugins", "ls")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "cri" && f[3] != "ok" {
			t.Fatalf("the CRI plugin did not load: %s", line)
		}
	}
	return sock
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// unmountUnder lazily unmounts what a test containerd left mounted below
// dir (overlay snapshots, the sandbox's shm), deepest first.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var mps []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			mps = append(mps, f[1])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		exec.Command("umount", "-l", mps[i]).Run()
	}
}

func criClient(t *testing.T, sock string) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}),
		grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// TestCRIPoststopReapsTree: a pod (host network) and a container created
// through CRI get kc-hook from the base spec; the container's host-side
// supervisor tree dies when the container is stopped through CRI, and the
// ledger holds the tree and the outcome.
func TestCRIPoststopReapsTree(t *testing.T) {
	hook := testutil.Build(t, testutil.KCHookPackage, "kc-hook")
	stateDir := t.TempDir()
	specPath := filepath.Join(t.TempDir(), "base-spec.json")
	if err := os.WriteFile(specPath, baseSpec(t, hook, stateDir), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := criContainerd(t, specPath)
	containerdtest.ImportImage(t, sock, "k8s.io")
	rs := criClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	v, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version: %v", err)
	}
	t.Logf("CRI runtime %s %s, API %s", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)

	id := runPodContainer(ctx, t, rs, "kc-pod")
	if !containerid.Valid(id) {
		t.Fatalf("CRI container ID %q is not 64 hex", id)
	}

	store, err := ledger.OpenReadOnly(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(id)
	if err != nil || rec == nil || rec.Init == nil {
		t.Fatalf("no createRuntime record with the init process for %s: %+v, %v", id, rec, err)
	}

	// The container's host-side supervisor tree as kc-hook would start it:
	// a `kc-hook supervise` wrapper carrying the ID, the supervisor, two
	// kernels and one that ignores SIGTERM.
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Children: 2, Stubborn: true})
	var members []fingerprint.Stat
	deadline := time.Now().Add(10 * time.Second)
	for len(members) < 5 {
		members = group(t, k.PGID)
		if time.Now().After(deadline) {
			t.Fatalf("tree of %d has %d members, want 5", k.PGID, len(members))
		}
		time.Sleep(20 * time.Millisecond)
	}

	if _, err := rs.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for alive(members) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the tree's members still alive 30s after StopContainer: poststop did not reap it", alive(members))
		}
		time.Sleep(20 * time.Millisecond)
	}
	rec, err = store.Load(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Stages["poststop"]; !ok || len(rec.Trees) != 1 || rec.Trees[0].PGID != k.PGID || rec.Outcome == "" {
		t.Fatalf("ledger after poststop: stages %v, trees %+v, outcome %q; want poststop, the tree of %d and an outcome", rec.Stages, rec.Trees, rec.Outcome, k.PGID)
	}
	t.Logf("ledger: outcome %q, tree %d with %d members, action %q", rec.Outcome, rec.Trees[0].PGID, len(rec.Trees[0].Members), rec.Trees[0].Action)
}

func group(t *testing.T, pgid int) []fingerprint.Stat {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []fingerprint.Stat
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		st, err := fingerprint.ReadStat("/proc", pid)
		if err == nil && st.PGID == pgid && !st.Zombie() {
			out = append(out, st)
		}
	}
	return out
}

func alive(ms []fingerprint.Stat) int {
	n := 0
	for _, m := range ms {
		if fingerprint.Alive("/proc", m) {
			n++
		}
	}
	return n
}
