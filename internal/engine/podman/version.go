package podman

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/docker"
	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// Version asks the podman API service's Docker-compatible GET /version
// over a unix socket; when no service answers there (podman without
// podman.socket, where the CLI is the ground truth) it asks the CLI.
func (p *podman) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AskTimeout())
	defer cancel()
	apiErr := errors.New("not a unix socket")
	if ep, err := engine.ParseURL(p.url); err == nil && ep.Network == "unix" {
		tr := peercred.NewTransportAs("podman's API socket", ep.Addr)
		defer tr.CloseIdleConnections()
		var v string
		if v, apiErr = docker.CompatVersion(ctx, p.cfg, ep, &http.Client{Transport: tr}); apiErr == nil {
			return v, nil
		}
	}
	bin := p.cfg.PodmanBin
	if bin == "" {
		bin = "podman"
	}
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("podman version: API: %w; CLI: %w", apiErr, err)
	}
	// "podman version 4.3.1"
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", fmt.Errorf("podman --version printed nothing")
	}
	return f[len(f)-1] + " (CLI)", nil
}
