package podman

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

func init() {
	engine.Register(engine.Spec{Name: "podman", Detect: detectPodman, New: New})
}

// podman is Query (API, then CLI) behind the engine.Engine interface.
type podman struct {
	cfg engine.Config
	url string
	// subscribed: a death stream was open once; a service that goes away
	// after that is a drop to retry, not a host without events.
	subscribed atomic.Bool
}

func New(cfg engine.Config) (engine.Engine, error) {
	switch env := os.Getenv("CONTAINER_HOST"); {
	case cfg.PodmanURL != "":
		if err := CheckURL(cfg.PodmanURL); err != nil {
			return nil, fmt.Errorf("%w: --podman-url: %w", engine.ErrUsage, err)
		}
	case env != "":
		// As Docker's DOCKER_HOST: a URL the janitor cannot ask (podman's
		// ssh://, for a remote host) is a setting to fix, not an engine
		// that is down.
		if err := CheckURL(env); err != nil {
			return nil, fmt.Errorf("%w: CONTAINER_HOST: %w; unset it or give --podman-url", engine.ErrUsage, err)
		}
	}
	return &podman{cfg: cfg, url: podmanURL(cfg)}, nil
}

func podmanURL(cfg engine.Config) string { return resolveURL(cfg.PodmanURL) }

// detectPodman finds podman when its API socket exists, a URL was given, or
// the CLI is installed (it reads its store without a service).
func detectPodman(cfg engine.Config) (string, bool) {
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

func (p *podman) Live(ctx context.Context) (engine.Answer, error) { return p.live(ctx, nil) }

// LiveOf asks the API about ids alone; the CLI fallback lists every
// container (whole).
func (p *podman) LiveOf(ctx context.Context, ids []string) (engine.Answer, bool, error) {
	a, err := p.live(ctx, ids)
	return a, a.Source == engine.SourceCLI, err
}

func (p *podman) live(ctx context.Context, only []string) (engine.Answer, error) {
	lo := Options{URL: p.cfg.PodmanURL, CLIArgs: p.cfg.PodmanArgs, PodmanBin: p.cfg.PodmanBin, Timeout: p.cfg.AskTimeout(), Logger: p.cfg.Log(), Only: only}
	set, err := Query(ctx, lo)
	if err != nil {
		return engine.Answer{}, err
	}
	return answerFromSet("podman", set), nil
}

// answerFromSet turns one engine's engine.Set into an Answer.
func answerFromSet(name string, set engine.Set) engine.Answer {
	a := engine.Answer{Engine: name, Endpoint: set.Endpoint, Source: set.Source, UID: set.UID, Took: set.Took}
	for id, st := range set.States {
		a.Containers = append(a.Containers, engine.Container{ID: id, Names: set.Names[id], State: st, Live: set.Live[id], InitPID: set.PIDs[id]})
	}
	return a
}

func (p *podman) Resolve(ctx context.Context, ref string) ([]engine.Match, error) {
	a, err := p.Live(ctx)
	if err != nil {
		return nil, err
	}
	return engine.MatchRef("podman", a.Containers, ref), nil
}
