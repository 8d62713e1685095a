package main

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/containerd"
	"github.com/kc-watchman/kc-watchman/internal/engine/cri"
	"github.com/kc-watchman/kc-watchman/internal/engine/docker"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// Names of the engine flags, given (like the global flags) to the app and
// to every command, before or after the command name.
const (
	flagEngine    = "engine"
	flagDockerURL = "docker-url"

	flagContainerdAddress   = "containerd-address"
	flagContainerdNamespace = "containerd-namespace"
	flagCRIEndpoint         = "cri-endpoint"
	flagPodmanTimeout       = "podman-timeout"
	flagPodmanArg           = "podman-arg"
)

func engineFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagEngine, Value: "auto", Usage: "container `ENGINES` to ask: auto (every engine whose endpoint exists here) or a comma list of podman, docker, containerd, cri", EnvVars: []string{"KC_ENGINE"}},
		&cli.DurationFlag{Name: flagPodmanTimeout, Value: 10 * time.Second, Usage: "bound on asking each container engine (for podman: API, then CLI)", EnvVars: []string{"KC_PODMAN_TIMEOUT"}},
		&cli.StringSliceFlag{Name: flagPodmanArg, Usage: "global `ARG` for the podman CLI, one per flag, repeatable (e.g. --podman-arg=--root=/srv/storage; KC_PODMAN_ARGS: comma-separated); a podman API service whose store is not the --root/--runroot named here is not believed: the CLI is asked instead", EnvVars: []string{"KC_PODMAN_ARGS"}},
		&cli.StringFlag{Name: flagContainerdAddress, Usage: "containerd socket `PATH`; default: CONTAINERD_ADDRESS, else the one of /run/containerd/containerd.sock, /run/k3s/containerd/containerd.sock (k3s, RKE2) and /var/snap/microk8s/common/run/containerd.sock that exists (several: exit 3 until one is named)", EnvVars: []string{"KC_CONTAINERD_ADDRESS"}},
		&cli.StringSliceFlag{Name: flagContainerdNamespace, Usage: "ask only containerd `NAMESPACE` (repeatable or comma-separated; default every namespace: moby is Docker's, k8s.io Kubernetes', default ctr's and nerdctl's)", EnvVars: []string{"KC_CONTAINERD_NAMESPACE"}},
		&cli.StringFlag{Name: flagCRIEndpoint, Usage: "CRI runtime socket `PATH` for --engine cri (CRI-O, or containerd's CRI plugin); default: /run/crio/crio.sock, else the containerd socket that exists (none when several do); auto asks CRI only where CRI-O's socket exists", EnvVars: []string{"KC_CRI_ENDPOINT"}},
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
	if sharedDuration(c, flagPodmanTimeout) <= 0 {
		return usageErr("--podman-timeout must be positive")
	}
	for _, lc := range c.Lineage() {
		for _, a := range lc.StringSlice(flagPodmanArg) {
			if err := checkPodmanArg(a); err != nil {
				return err
			}
		}
	}
	g.DockerURL = sharedString(c, flagDockerURL)
	if err := docker.CheckURL(g.DockerURL); err != nil {
		return engineUsageErr(err)
	}
	g.ContainerdAddress = sharedString(c, flagContainerdAddress)
	g.ContainerdNamespaces = sharedSlice(c, flagContainerdNamespace)
	if err := containerd.CheckSettings(g.ContainerdAddress, g.ContainerdNamespaces); err != nil {
		return engineUsageErr(err)
	}
	g.CRIEndpoint = sharedString(c, flagCRIEndpoint)
	if err := cri.CheckSettings(g.CRIEndpoint); err != nil {
		return engineUsageErr(err)
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
		CRIEndpoint:          g.CRIEndpoint,
		Timeout:              sharedDuration(c, flagPodmanTimeout),
		Logger:               log,
	}
	if args := sharedSlice(c, flagPodmanArg); len(args) > 0 {
		cfg.PodmanArgs = args
	}
	return cfg
}

// selectEngines parses --engine and builds the engines to ask; a bad name
// or endpoint is a usage error (exit 2).
func selectEngines(c *cli.Context, g globals, log *slog.Logger) ([]engine.Engine, error) {
	es, err := settingsOf(c, g, reconcile.Options{}).Select(log)
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

// containerRef is what a --container value may look like: a container
// name (Docker's and podman's rule), which full IDs and ID prefixes
// match too, or a Kubernetes namespace/pod/container (the CRI engine's
// names). Compiled when first used, not at every start.
var containerRef = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*(/[a-zA-Z0-9][a-zA-Z0-9_.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*)?$`)
})

// resolveContainer turns a --container value into a container, the same
// way on every command: a full 64-hex ID is taken as is unless needPID
// (reconcile needs no engine to know a container that may be long gone);
// a unique ID prefix or a name is resolved by the engines. No match or
// several → exit 2 naming the candidates; an engine that cannot be asked
// → exit 3.
func resolveContainer(ctx context.Context, c *cli.Context, g globals, ref string, needPID bool) (engine.Match, error) {
	if !containerRef().MatchString(ref) {
		return engine.Match{}, usageErr("--container %q is not a container name, ID, ID prefix or namespace/pod/container", ref)
	}
	if containerid.Valid(ref) && !needPID {
		return engine.Match{ID: ref}, nil
	}
	log := slog.New(slog.DiscardHandler)
	es, err := selectEngines(c, g, log)
	if err != nil {
		return engine.Match{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := engine.ResolveOne(ctx, es, ref)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, engine.ErrUsage):
		return m, engineUsageErr(err)
	default:
		return m, cli.Exit("--container: "+err.Error()+"; nothing was touched", exitUnknown)
	}
}

// checkPodmanArg refuses a --podman-arg podman would take for something
// else than meant. Each value is one argument: "--root=/a --runroot=/b"
// (KC_PODMAN_ARGS written as a shell would split it) reaches podman as a
// --root of "/a --runroot=/b", a new, empty store whose answer calls
// every tree stray.
func checkPodmanArg(a string) error {
	switch f := strings.Fields(a); {
	case len(f) == 0:
		return usageErr("--podman-arg must not be empty")
	case slices.ContainsFunc(f[1:], func(w string) bool { return strings.HasPrefix(w, "-") }):
		return usageErr("--podman-arg %q holds several arguments: give each its own --podman-arg (KC_PODMAN_ARGS: separate them with commas)", a)
	}
	return nil
}
