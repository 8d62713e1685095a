package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/liveness"
)

// Names of the engine flags, given (like the global flags) to the app and
// to every command, before or after the command name.
const (
	flagEngine    = "engine"
	flagDockerURL = "docker-url"

	flagContainerdAddress   = "containerd-address"
	flagContainerdNamespace = "containerd-namespace"
)

func engineFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagEngine, Value: "auto", Usage: "container `ENGINES` to ask: auto (every engine whose endpoint exists here) or a comma list of podman, docker, containerd", EnvVars: []string{"KC_ENGINE"}},
		&cli.StringFlag{Name: flagContainerdAddress, Usage: "containerd socket `PATH`; default: CONTAINERD_ADDRESS, else /run/containerd/containerd.sock", EnvVars: []string{"KC_CONTAINERD_ADDRESS"}},
		&cli.StringSliceFlag{Name: flagContainerdNamespace, Usage: "ask only containerd `NAMESPACE` (repeatable or comma-separated; default every namespace: moby is Docker's, k8s.io Kubernetes', default ctr's and nerdctl's)", EnvVars: []string{"KC_CONTAINERD_NAMESPACE"}},
		&cli.StringFlag{Name: flagDockerURL, Usage: "Docker Engine API `URL` (unix:///path or tcp://host:port); default: DOCKER_HOST, else unix:///var/run/docker.sock", EnvVars: []string{"KC_DOCKER_URL"}},
	}
}

// loadEngineGlobals reads --engine and the engine endpoints that are not
// podman's (that one is checked where it always was).
func loadEngineGlobals(c *cli.Context, g *globals) error {
	names, err := engine.ParseNames(sharedString(c, flagEngine))
	if err != nil {
		return engineUsageErr(err)
	}
	g.Engines = names
	g.DockerURL = sharedString(c, flagDockerURL)
	if err := engine.CheckDockerURL(g.DockerURL); err != nil {
		return engineUsageErr(err)
	}
	g.ContainerdAddress = sharedString(c, flagContainerdAddress)
	g.ContainerdNamespaces = sharedSlice(c, flagContainerdNamespace)
	if err := engine.CheckContainerdSettings(g.ContainerdAddress, g.ContainerdNamespaces); err != nil {
		return engineUsageErr(err)
	}
	return nil
}

// sharedSlice is sharedString for a repeatable flag: the innermost
// position that set it wins.
func sharedSlice(c *cli.Context, name string) []string {
	for _, lc := range c.Lineage() {
		if lc.IsSet(name) {
			var out []string
			for _, v := range lc.StringSlice(name) {
				if v = strings.TrimSpace(v); v != "" {
					out = append(out, v)
				}
			}
			return out
		}
	}
	return nil
}

// engineConfig gathers every engine's settings from the flags.
func engineConfig(c *cli.Context, g globals, log *slog.Logger) engine.Config {
	cfg := engine.Config{
		PodmanURL: g.PodmanURL,
		DockerURL: g.DockerURL,

		ContainerdAddress:    g.ContainerdAddress,
		ContainerdNamespaces: g.ContainerdNamespaces,
		Timeout:              c.Duration("podman-timeout"),
		Logger:               log,
	}
	if args := c.StringSlice("podman-arg"); len(args) > 0 {
		cfg.PodmanArgs = args
	}
	return cfg
}

// selectEngines parses --engine and builds the engines to ask; a bad name
// or endpoint is a usage error (exit 2).
func selectEngines(c *cli.Context, g globals, log *slog.Logger) ([]engine.Engine, error) {
	es, err := engine.Select(g.Engines, engineConfig(c, g, log))
	if err != nil {
		return nil, engineUsageErr(err)
	}
	return es, nil
}

// checkEngines refuses a bad --engine or endpoint up front, before any
// scan or question.
func checkEngines(c *cli.Context, g globals) error {
	_, err := selectEngines(c, g, slog.New(slog.DiscardHandler))
	return err
}

func engineUsageErr(err error) error {
	if errors.Is(err, engine.ErrUsage) {
		return usageErr("%s", strings.TrimPrefix(err.Error(), engine.ErrUsage.Error()+": "))
	}
	return err
}

// askEngines asks every selected engine which containers are alive. The
// error wraps liveness.ErrUnknown when the truth is unknown; a usage
// error (exit 2) when --engine or an endpoint is malformed.
func askEngines(ctx context.Context, c *cli.Context, g globals, log *slog.Logger) (engine.Truth, error) {
	es, err := selectEngines(c, g, log)
	if err != nil {
		return engine.Truth{}, err
	}
	tr, err := engine.Ask(ctx, es)
	for _, st := range tr.Statuses {
		if st.Error == nil {
			log.Debug("engine answered", "engine", st.Name, "endpoint", st.Endpoint, "source", st.Source, "uid", st.UID, "containers", st.Containers, "live", st.Live)
		}
	}
	return tr, err
}

// queryLiveness is the union of every selected engine's answer.
func queryLiveness(ctx context.Context, c *cli.Context, g globals, log *slog.Logger) (liveness.Set, error) {
	tr, err := askEngines(ctx, c, g, log)
	if err != nil {
		return liveness.Set{}, err
	}
	return tr.Set, nil
}
