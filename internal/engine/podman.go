package engine

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"

	"github.com/kc-watchman/kc-watchman/internal/liveness"
)

func init() {
	Register(Spec{Name: "podman", Detect: detectPodman, New: newPodman})
}

// podman is today's liveness query (API, then CLI) behind the Engine
// interface.
type podman struct {
	cfg Config
	url string
	// subscribed: a death stream was open once; a service that goes away
	// after that is a drop to retry, not a host without events.
	subscribed atomic.Bool
}

func newPodman(cfg Config) (Engine, error) {
	if cfg.PodmanURL != "" {
		if err := liveness.CheckURL(cfg.PodmanURL); err != nil {
			return nil, fmt.Errorf("%w: --podman-url: %w", ErrUsage, err)
		}
	}
	return &podman{cfg: cfg, url: podmanURL(cfg)}, nil
}

func podmanURL(cfg Config) string {
	if cfg.PodmanURL != "" {
		return cfg.PodmanURL
	}
	if env := os.Getenv("CONTAINER_HOST"); env != "" {
		return env
	}
	return liveness.DefaultURL()
}

// detectPodman finds podman when its API socket exists, a URL was given, or
// the CLI is installed (it reads its store without a service).
func detectPodman(cfg Config) (string, bool) {
	u := podmanURL(cfg)
	if cfg.PodmanURL != "" || os.Getenv("CONTAINER_HOST") != "" {
		return u, true
	}
	if p, ok := strings.CutPrefix(u, "unix://"); ok {
		if _, err := os.Lstat(p); err == nil {
			return u, true
		}
	}
	bin := cfg.PodmanBin
	if bin == "" {
		bin = "podman"
	}
	if p, err := exec.LookPath(bin); err == nil {
		return p, true
	}
	return "", false
}

func (p *podman) Name() string     { return "podman" }
func (p *podman) Endpoint() string { return p.url }

func (p *podman) Live(ctx context.Context) (Answer, error) {
	lo := liveness.Options{URL: p.cfg.PodmanURL, CLIArgs: p.cfg.PodmanArgs, PodmanBin: p.cfg.PodmanBin, Timeout: p.cfg.timeout(), Logger: p.cfg.logger()}
	set, err := liveness.Query(ctx, lo)
	if err != nil {
		return Answer{}, err
	}
	return answerFromSet("podman", set), nil
}

// answerFromSet turns one engine's liveness.Set into an Answer.
func answerFromSet(name string, set liveness.Set) Answer {
	a := Answer{Engine: name, Endpoint: set.Endpoint, Source: set.Source, UID: set.UID, Took: set.Took}
	for id, st := range set.States {
		a.Containers = append(a.Containers, Container{ID: id, Names: set.Names[id], State: st, Live: set.Live[id], InitPID: set.PIDs[id]})
	}
	return a
}

func (p *podman) Resolve(ctx context.Context, ref string) ([]Match, error) {
	a, err := p.Live(ctx)
	if err != nil {
		return nil, err
	}
	return MatchRef("podman", a.Containers, ref), nil
}
