package podman

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/docker"
	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
	"github.com/kc-watchman/kc-watchman/internal/headbuf"
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
	// As every CLI call: in its own group, killed with it at the deadline,
	// and only the first line's worth of what it prints kept.
	cmd, err := Command(ctx, p.cfg.PodmanBin, []string{"--version"})
	if err != nil {
		return "", fmt.Errorf("podman version: API: %w; CLI: %w", apiErr, err)
	}
	out := &headbuf.Buffer{Max: 4096}
	cmd.Stdout = out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return "", fmt.Errorf("podman version: API: %w; CLI: %w", apiErr, err)
	}
	// "podman version 4.3.1"
	line, _, _ := strings.Cut(string(out.Bytes()), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", fmt.Errorf("podman --version printed nothing")
	}
	return f[len(f)-1] + " (CLI)", nil
}
