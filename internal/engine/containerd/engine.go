package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

func init() {
	engine.Register(engine.Spec{Name: "containerd", Detect: detectContainerd, New: New})
}

// namespaceName is containerd's rule for a namespace identifier: a name
// it would refuse can only be a typo.
// Compiled when first used, not at every start of the janitor.
var namespaceName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)
})

// containerd asks containerd through the gRPC services of its api module
// (client.go; docs/ENGINES.md, "containerd"). Each question
// opens its own connection and closes it before returning: engines are
// built per question and per round and dropped without a word, and a
// connection held by an engine would outlive it (one socket and three
// goroutines per round of watch, on both sides).
type containerd struct {
	cfg        engine.Config
	address    string
	namespaces []string
	// ambiguous names the known sockets that all exist when none was
	// given: asking one would leave the other's containers out of the
	// ground truth, so every question fails (exit 3) until one is named.
	ambiguous []string
}

// KnownSockets are where Kubernetes distributions put containerd's
// socket: upstream's, k3s's and RKE2's, microk8s's. With no address given,
// the first that exists is asked; on a k3s node auto must not fall back to
// podman or Docker and miss every pod.
var KnownSockets = []string{
	DefaultAddress,
	"/run/k3s/containerd/containerd.sock",
	"/var/snap/microk8s/common/run/containerd.sock",
}

// containerdAddress is --containerd-address, else $CONTAINERD_ADDRESS,
// else where auto found it first (cfg.Detected), else the first of the
// known sockets that exists (else upstream's).
func containerdAddress(cfg engine.Config) string {
	if cfg.ContainerdAddress != "" || os.Getenv("CONTAINERD_ADDRESS") != "" {
		return ResolveAddress(cfg.ContainerdAddress)
	}
	if cfg.Detected != "" {
		return cfg.Detected
	}
	if p, ok := engine.FirstExisting(KnownSockets); ok {
		return p
	}
	return DefaultAddress
}

// CheckSettings refuses a malformed --containerd-address or
// --containerd-namespace before anything runs.
func CheckSettings(addr string, namespaces []string) error {
	if _, err := CheckAddress(ResolveAddress(addr)); err != nil {
		return fmt.Errorf("%w: --containerd-address: %w", engine.ErrUsage, err)
	}
	for _, ns := range namespaces {
		if len(ns) > 76 || !namespaceName().MatchString(ns) {
			return fmt.Errorf("%w: --containerd-namespace %q: not a containerd namespace name (letters, digits, and . _ - between them)", engine.ErrUsage, ns)
		}
	}
	return nil
}

func New(cfg engine.Config) (engine.Engine, error) {
	if err := CheckSettings(cfg.ContainerdAddress, cfg.ContainerdNamespaces); err != nil {
		return nil, err
	}
	p, err := CheckAddress(containerdAddress(cfg))
	if err != nil {
		return nil, fmt.Errorf("%w: --containerd-address: %w", engine.ErrUsage, err)
	}
	c := &containerd{cfg: cfg, address: p, namespaces: cfg.ContainerdNamespaces}
	if cfg.ContainerdAddress == "" && os.Getenv("CONTAINERD_ADDRESS") == "" {
		if found := engine.Existing(KnownSockets); len(found) > 1 {
			c.ambiguous = found
		}
	}
	return c, nil
}

// open makes the client for one question; the caller closes it.
func (c *containerd) open() (*Client, error) {
	if len(c.ambiguous) > 1 {
		return nil, fmt.Errorf("containerd sockets at %s all exist: asking one would miss the others' containers; name the one to ask with --containerd-address (KC_CONTAINERD_ADDRESS)", strings.Join(c.ambiguous, " and "))
	}
	cl, err := Dial(c.address)
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", c.address, err)
	}
	return cl, nil
}

// detectContainerd finds containerd when an address was given or its
// socket exists (a symlink too: asking will refuse it, loudly).
func detectContainerd(cfg engine.Config) (string, bool) {
	addr := containerdAddress(cfg)
	if cfg.ContainerdAddress != "" || os.Getenv("CONTAINERD_ADDRESS") != "" {
		return addr, true
	}
	if _, ok := engine.FirstExisting(KnownSockets); ok {
		return addr, true
	}
	// Not found: say every place looked at (doctor prints it).
	return strings.Join(KnownSockets, " or "), false
}

func (c *containerd) Name() string     { return "containerd" }
func (c *containerd) Endpoint() string { return c.address }

// list asks every namespace (or the named ones) at once; uid is the
// answering peer's.
func (c *containerd) list(ctx context.Context, only []string) (cs []Container, took time.Duration, uid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AskTimeout())
	defer cancel()
	cl, err := c.open()
	if err != nil {
		return nil, 0, engine.UIDUnknown, err
	}
	defer cl.Close()
	start := time.Now()
	if only == nil {
		cs, err = cl.List(ctx, c.namespaces)
	} else {
		cs, err = cl.ListOf(ctx, c.namespaces, only)
	}
	return cs, time.Since(start), cl.PeerUID(), err
}

// Live lists the containers whose IDs are container ID tokens (64 hex):
// only those can be carried by a supervisor tree. Other IDs (ctr and
// nerdctl names) are left out of the ground truth, and Resolve still
// finds them.
func (c *containerd) Live(ctx context.Context) (engine.Answer, error) { return c.live(ctx, nil) }

// LiveOf asks about ids alone (Client.ListOf); when a task of theirs
// cannot be asked, it lists everything (whole).
func (c *containerd) LiveOf(ctx context.Context, ids []string) (engine.Answer, bool, error) {
	a, err := c.live(ctx, ids)
	if errors.Is(err, ErrTaskUnread) {
		c.cfg.Log().Info("a task could not be asked alone; listing every task", "engine", "containerd", "err", err)
		a, err = c.live(ctx, nil)
		return a, true, err
	}
	return a, false, err
}

func (c *containerd) live(ctx context.Context, only []string) (engine.Answer, error) {
	cs, took, uid, err := c.list(ctx, only)
	if err != nil {
		return engine.Answer{}, err
	}
	if uid == engine.UIDUnknown {
		return engine.Answer{}, errors.New("containerd at " + c.address + ": the answering peer's UID could not be read")
	}
	a := engine.Answer{Engine: "containerd", Endpoint: c.address, Source: engine.SourceAPI, UID: uid, Took: took}
	for _, x := range cs {
		if !containerid.Valid(x.ID) {
			continue
		}
		a.Containers = append(a.Containers, engine.Container{ID: x.ID, State: x.Status, Live: x.Live, InitPID: x.PID, Pod: engine.PodName(x.Labels)})
	}
	return a, nil
}

// Resolve matches ref against every listed container, 64-hex or not, in
// every namespace asked: the same ID in two namespaces is two candidates.
func (c *containerd) Resolve(ctx context.Context, ref string) ([]engine.Match, error) {
	cs, _, _, err := c.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	all := make([]engine.Container, 0, len(cs))
	for _, x := range cs {
		all = append(all, engine.Container{ID: x.ID, State: x.Status, Live: x.Live, InitPID: x.PID, Pod: engine.PodName(x.Labels)})
	}
	return engine.MatchRef("containerd", all, ref), nil
}

// Deaths follows containerd's /tasks/exit and /tasks/delete events.
// containerd replays nothing, so w.Since is not used.
func (c *containerd) Deaths(ctx context.Context, w engine.DeathWatch) error {
	ready, done := w.ReadySignal()
	defer done()
	cl, err := c.open()
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.Subscribe(ctx, c.namespaces, ready, func(e Event) {
		if !containerid.Valid(e.ContainerID) {
			return
		}
		at := e.At
		if at.IsZero() {
			at = time.Now()
		}
		w.Death(engine.Death{Engine: "containerd", ID: e.ContainerID, At: at})
	})
}
