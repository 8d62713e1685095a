package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// TestAutoFindsK3sContainerd: on a k3s or RKE2 node containerd's socket
// is /run/k3s/containerd/containerd.sock, not /run/containerd's; --engine
// auto must find and ask it there, or every pod is missing from the
// answer. A private mount namespace puts the private containerd's socket
// at the k3s path, over an empty /run.
func TestAutoFindsK3sContainerd(t *testing.T) {
	addr := strings.TrimPrefix(containerdtest.Address(t), "unix://")
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	janitorBin := bin(t, "kc-janitor")
	tmp := t.TempDir()
	// The socket, bind-mounted aside before /run is covered (it may live
	// under /run itself), then onto the k3s path.
	const k3s = "/run/k3s/containerd/containerd.sock"
	script := `set -e
/bin/touch "$1/sock"
/bin/mount --bind "$2" "$1/sock"
/bin/mount -t tmpfs none /run
/bin/mkdir -p /run/k3s/containerd
/bin/touch ` + k3s + `
/bin/mount --bind "$1/sock" ` + k3s + `
if [ "$3" = both ]; then
	/bin/mkdir -p /run/containerd
	/bin/touch /run/containerd/containerd.sock
	/bin/mount --bind "$1/sock" /run/containerd/containerd.sock
fi
shift 3
exec "$@"`
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KC_") || slices.Contains([]string{"DOCKER_HOST", "CONTAINER_HOST", "CONTAINERD_ADDRESS"}, k) {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+t.TempDir(), "KC_STATE_DIR="+filepath.Join(tmp, "state"))
	run := func(layout string) (reconcileOut, string, int) {
		t.Helper()
		args := []string{"--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", tmp, addr, layout, janitorBin,
			"reconcile", "--format", "json", "--container", testutil.RandomHex(t, 64)}
		cmd := exec.Command("unshare", args...)
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var rep reconcileOut
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("no JSON (exit %d): %v: %s\nstderr: %s", code, err, out, stderr.String())
		}
		return rep, stderr.String(), code
	}

	rep, stderr, code := run("k3s")
	if code != 0 || !rep.LivenessKnown || len(rep.Engines) != 1 || rep.Engines[0].Name != "containerd" || rep.Engines[0].Endpoint != k3s || rep.Engines[0].Error != nil {
		t.Errorf("auto on a k3s node: exit %d, asked %+v (liveness known %v), want containerd at %s; stderr %s", code, rep.Engines, rep.LivenessKnown, k3s, stderr)
	}
	// Upstream's socket and k3s's both there: asking one would leave the
	// other's containers out of the answer. Unknown, nothing touched.
	rep, stderr, code = run("both")
	if code != 3 || rep.LivenessKnown || len(rep.Engines) != 1 || rep.Engines[0].Error == nil || !strings.Contains(*rep.Engines[0].Error, "--containerd-address") {
		t.Errorf("auto with two containerd sockets: exit %d, %+v; want 3 naming --containerd-address; stderr %s", code, rep.Engines, stderr)
	}
}

type reconcileOut struct {
	LivenessKnown bool `json:"liveness_known"`
	Engines       []struct {
		Name     string  `json:"name"`
		Endpoint string  `json:"endpoint"`
		Error    *string `json:"error"`
	} `json:"engines"`
}
