package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/peercred"
)

// Versioner is an engine that can say which version answers: doctor shows
// it next to the engine's check. It is a question apart from Live, so an
// engine whose version cannot be read is still ground truth.
type Versioner interface {
	Version(ctx context.Context) (string, error)
}

// ErrNoVersion is VersionOf's answer for an engine that cannot say.
var ErrNoVersion = errors.New("this engine does not report its version")

// VersionOf asks e its version, bounded by the engine's timeout.
func VersionOf(ctx context.Context, e Engine) (string, error) {
	v, ok := e.(Versioner)
	if !ok {
		return "", ErrNoVersion
	}
	return v.Version(ctx)
}

// dockerVersion is the part of Docker's (and podman's compatible) GET
// /version answer we read.
type dockerVersion struct {
	Version    string `json:"Version"`
	APIVersion string `json:"ApiVersion"`
}

func (v dockerVersion) String() string {
	if v.APIVersion == "" {
		return v.Version
	}
	return v.Version + " (API " + v.APIVersion + ")"
}

// Version asks dockerd's GET /version.
func (d *docker) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	hc, _ := d.client()
	defer hc.CloseIdleConnections()
	var v dockerVersion
	if err := d.get(ctx, hc, "/version", &v); err != nil {
		return "", err
	}
	if v.Version == "" {
		return "", fmt.Errorf("docker API %s: /version names no version", d.ep.raw)
	}
	return v.String(), nil
}

// Version asks containerd's version service.
func (c *containerd) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout())
	defer cancel()
	cl, err := c.open()
	if err != nil {
		return "", err
	}
	defer cl.Close()
	return cl.Version(ctx)
}

// Version asks the podman API service's Docker-compatible GET /version
// over a unix socket; when no service answers there (podman without
// podman.socket, where the CLI is the ground truth) it asks the CLI.
func (p *podman) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.timeout())
	defer cancel()
	apiErr := errors.New("not a unix socket")
	if ep, err := parseAPIURL("podman-url", p.url); err == nil && ep.network == "unix" {
		tr := peercred.NewTransportAs("podman's API socket", ep.addr)
		defer tr.CloseIdleConnections()
		d := &docker{cfg: p.cfg, ep: ep}
		var v dockerVersion
		if apiErr = d.get(ctx, &http.Client{Transport: tr}, "/version", &v); apiErr == nil && v.Version != "" {
			return v.String(), nil
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
