package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/containerdtest"
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
shift 2
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
	args := []string{"--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", tmp, addr, janitorBin,
		"reconcile", "--format", "json", "--container", randomHex(t, 32)}
	cmd := exec.Command("unshare", args...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("reconcile with --engine auto on a k3s layout: %v\nstdout: %s\nstderr: %s", err, out, stderr)
	}
	var rep struct {
		LivenessKnown bool `json:"liveness_known"`
		Engines       []struct {
			Name     string  `json:"name"`
			Endpoint string  `json:"endpoint"`
			Error    *string `json:"error"`
		} `json:"engines"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("no JSON: %v: %s", err, out)
	}
	if !rep.LivenessKnown || len(rep.Engines) != 1 || rep.Engines[0].Name != "containerd" || rep.Engines[0].Endpoint != k3s || rep.Engines[0].Error != nil {
		t.Errorf("auto on a k3s node asked %+v (liveness known %v), want containerd at %s", rep.Engines, rep.LivenessKnown, k3s)
	}
}
