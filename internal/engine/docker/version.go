package docker

import (
	"context"
	"fmt"
	"net/http"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

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
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AskTimeout())
	defer cancel()
	hc, _ := d.client()
	defer hc.CloseIdleConnections()
	var v dockerVersion
	if err := d.get(ctx, hc, "/version", &v); err != nil {
		return "", err
	}
	if v.Version == "" {
		return "", fmt.Errorf("docker API %s: /version names no version", d.ep.Raw)
	}
	return v.String(), nil
}

// CompatVersion asks the Docker-compatible GET /version of the service at
// ep through hc (podman's service speaks it too), bounded by cfg's timeout
// for the operator's wording of a hung answer.
func CompatVersion(ctx context.Context, cfg engine.Config, ep engine.URL, hc *http.Client) (string, error) {
	d := &docker{cfg: cfg, ep: ep}
	var v dockerVersion
	if err := d.get(ctx, hc, "/version", &v); err != nil {
		return "", err
	}
	if v.Version == "" {
		return "", fmt.Errorf("%s: /version names no version", ep.Raw)
	}
	return v.String(), nil
}
