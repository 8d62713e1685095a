package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestDockerOnlyHost: on a host with dockerd and no podman at all (no CLI
// on PATH, no API socket), every command runs with the defaults, --engine
// auto finding docker alone, and none fails for want of podman. The host's
// /run/podman and /run/containerd are hidden by a private mount namespace
// so whatever else this machine runs is not found.
func TestDockerOnlyHost(t *testing.T) {
	d := dockertest.Need(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	name := "positron-server-" + testutil.RandomHex(t, 12)
	d.Run(t, []string{"--name", name})
	janitorBin := bin(t, "kc-janitor")
	emptyPath := t.TempDir() // no podman here, nor anything else
	socks, state, hooks := t.TempDir(), t.TempDir(), t.TempDir()

	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KC_") || slices.Contains([]string{"PATH", "DOCKER_HOST", "CONTAINER_HOST", "CONTAINERD_ADDRESS"}, k) {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+emptyPath, "DOCKER_HOST="+d.URL, "KC_STATE_DIR="+state)
	// The host's commands look in a dir of this test's own (the host's
	// /tmp holds other tests' supervisors); inside the container, its /tmp.
	host := []string{"KC_SOCKET_DIR=" + socks}

	// hide mounts an empty tmpfs over the host's engine directories (a
	// directory that does not exist hides nothing) or exits 97; mount by
	// its path, since PATH is empty.
	const hide = `for d in /run/podman /run/containerd; do [ ! -d "$d" ] || /bin/mount -t tmpfs none "$d" || exit 97; done; exec "$@"`
	run := func(t *testing.T, extraEnv []string, args ...string) (string, string, int) {
		t.Helper()
		full := append([]string{"--mount", "--propagation", "private", "/bin/sh", "-c", hide, "sh", janitorBin}, args...)
		cmd := exec.Command("unshare", full...)
		cmd.Env = append(slices.Clone(env), extraEnv...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		code := 0
		if err := cmd.Run(); err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Fatalf("unshare kc-janitor %s: %v", strings.Join(args, " "), err)
			}
			code = ee.ExitCode()
		}
		return out.String(), errb.String(), code
	}

	for _, tc := range []struct {
		name     string
		env      []string
		args     []string
		maxCode  int // doctor's exit is its worst verdict: warnings allowed
		wantJSON bool
	}{
		{"version", nil, []string{"version"}, 0, false},
		{"reconcile", host, []string{"reconcile", "--format", "json"}, 0, true},
		{"sweep", host, []string{"sweep", "--format", "json"}, 0, true},
		{"sweep inside the container", []string{"KC_CONTAINER=" + name}, []string{"sweep", "--format", "json"}, 0, true},
		{"cull", host, []string{"cull", "--format", "json"}, 0, true},
		{"cull inside the container", nil, []string{"cull", "--container", name, "--format", "json"}, 0, true},
		{"status", host, []string{"status", "--format", "json"}, 0, true},
		{"doctor", host, []string{"doctor", "--hooks-dir", hooks, "--format", "json"}, 1, true},
		{"watch once", host, []string{"watch", "--once"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, tc.env, tc.args...)
			if code > tc.maxCode {
				t.Fatalf("exit %d, want ≤ %d\nstdout: %s\nstderr: %s", code, tc.maxCode, out, errOut)
			}
			if strings.Contains(strings.ToLower(errOut), "podman") && !strings.Contains(errOut, "level=DEBUG") {
				t.Errorf("a Docker-only host's run mentions podman:\n%s", errOut)
			}
			if !tc.wantJSON {
				return
			}
			var rep struct {
				Engines []struct {
					Name  string  `json:"name"`
					Error *string `json:"error"`
				} `json:"engines"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			for _, e := range rep.Engines {
				if e.Name == "podman" && tc.args[0] != "doctor" {
					t.Errorf("podman was asked: %+v", rep.Engines)
				}
			}
		})
	}
}
