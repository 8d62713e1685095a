package sockets

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// PodmanInitPID asks the podman CLI for the host PID of a running
// container's init process (podman inspect --format {{.State.Pid}}); url,
// when set, is passed as podman's --url. A container that is not running
// has PID 0 and is an error.
func PodmanInitPID(ctx context.Context, url, container string) (int, error) {
	var args []string
	if url != "" {
		args = append(args, "--url", url)
	}
	args = append(args, "inspect", "--type", "container", "--format", "{{.State.Pid}}", "--", container)
	cmd := exec.CommandContext(ctx, "podman", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("podman inspect %s: %v: %s", container, err, strings.TrimSpace(stderr.String()))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return 0, fmt.Errorf("podman inspect %s: unexpected pid %q", container, strings.TrimSpace(string(out)))
	}
	if pid <= 0 {
		return 0, fmt.Errorf("container %s is not running", container)
	}
	return pid, nil
}
