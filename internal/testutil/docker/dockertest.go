// Package dockertest drives the private dockerd that .ci/lib/dockerd.sh
// starts (KC_TEST_DOCKER_URL, KC_TEST_DOCKER_IMAGE, KC_TEST_DOCKER_CLI)
// for the tests that need a real Docker Engine. Without it they skip, and
// with KC_E2E=1 they fail.
package dockertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Docker is the private dockerd.
type Docker struct {
	URL   string
	Image string
	CLI   string
}

// Need returns the private dockerd, skipping the test (failing it with
// KC_E2E=1) when there is none.
func Need(t testing.TB) *Docker {
	t.Helper()
	u := os.Getenv("KC_TEST_DOCKER_URL")
	if u == "" {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatal("KC_E2E=1 but KC_TEST_DOCKER_URL is unset (source .ci/lib/dockerd.sh; start_dockerd)")
		}
		t.Skip("KC_TEST_DOCKER_URL unset: no private dockerd (source .ci/lib/dockerd.sh; start_dockerd)")
	}
	d := &Docker{URL: u, Image: os.Getenv("KC_TEST_DOCKER_IMAGE"), CLI: os.Getenv("KC_TEST_DOCKER_CLI")}
	if d.Image == "" {
		d.Image = "kc-busybox"
	}
	if d.CLI == "" {
		d.CLI = "docker"
	}
	return d
}

// Docker runs the docker CLI against the private dockerd.
func (d *Docker) Docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.CLI, append([]string{"-H", d.URL}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+os.TempDir()+"/kc-dockertest-config")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// Must is Docker that fails the test on error.
func (d *Docker) Must(t testing.TB, args ...string) string {
	t.Helper()
	out, err := d.Docker(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Run starts a container (docker run -d --network none IMAGE cmd...) with
// the given extra run options before the image, removes it at the end of
// the test, and returns its full ID.
func (d *Docker) Run(t testing.TB, opts []string, cmd ...string) string {
	t.Helper()
	args := append([]string{"run", "-d", "--network", "none"}, opts...)
	args = append(args, d.Image)
	if len(cmd) == 0 {
		cmd = []string{"/bin/sleep", "100000"}
	}
	id := d.Must(t, append(args, cmd...)...)
	t.Cleanup(func() { d.Docker("rm", "-f", id) })
	return id
}

// InitPID is the container's State.Pid.
func (d *Docker) InitPID(t testing.TB, id string) int {
	t.Helper()
	s := d.Must(t, "inspect", "--type", "container", "--format", "{{.State.Pid}}", id)
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		t.Fatalf("docker inspect %s: State.Pid %q", id, s)
	}
	return pid
}
