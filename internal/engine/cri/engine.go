package cri

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/containerd"
)

func init() {
	engine.Register(engine.Spec{Name: "cri", Detect: detectCRI, New: newCRI})
}

// statusConcurrency bounds the verbose status questions of one list: the
// init PIDs the pins need come one container at a time.
const statusConcurrency = 8

// criEngine asks any CRI runtime through Client. Like containerd,
// each question opens its own connection and closes it.
type criEngine struct {
	cfg      engine.Config
	endpoint string
	// ambiguous lists the runtime sockets found when none was named and
	// more than one exists: asking one would miss the others' containers,
	// so every question fails (as the containerd engine's does).
	ambiguous []string
}

// criEndpoint is --cri-endpoint, else CRI-O's socket if it exists, else
// the first containerd socket that exists (its CRI plugin serves the same
// socket), else CRI-O's; newCRI refuses to ask when several exist.
func criEndpoint(cfg engine.Config) string {
	if cfg.CRIEndpoint != "" {
		return cfg.CRIEndpoint
	}
	if cfg.Detected != "" {
		return cfg.Detected
	}
	if p, ok := engine.FirstExisting(append([]string{CRIOSocket}, containerd.KnownSockets...)); ok {
		return p
	}
	return CRIOSocket
}

// detectCRI: auto asks CRI only where CRI-O's socket exists, or an
// endpoint was named. A containerd socket is the containerd engine's:
// asking it twice, once through each API, adds nothing.
func detectCRI(cfg engine.Config) (string, bool) {
	if cfg.CRIEndpoint != "" {
		return cfg.CRIEndpoint, true
	}
	// As for the other engines: a socket this user cannot connect to is
	// left out (engine.Existing).
	_, ok := engine.FirstExisting([]string{CRIOSocket})
	return CRIOSocket, ok
}

// CheckSettings refuses a malformed --cri-endpoint before anything runs.
func CheckSettings(ep string) error {
	if ep == "" {
		return nil
	}
	if _, err := CheckEndpoint(ep); err != nil {
		return fmt.Errorf("%w: --cri-endpoint: %w", engine.ErrUsage, err)
	}
	return nil
}

func newCRI(cfg engine.Config) (engine.Engine, error) {
	if err := CheckSettings(cfg.CRIEndpoint); err != nil {
		return nil, err
	}
	p, err := CheckEndpoint(criEndpoint(cfg))
	if err != nil {
		return nil, fmt.Errorf("%w: --cri-endpoint: %w", engine.ErrUsage, err)
	}
	e := &criEngine{cfg: cfg, endpoint: p}
	e.ambiguous = ambiguous(cfg, engine.Existing(append([]string{CRIOSocket}, containerd.KnownSockets...)))
	return e, nil
}

// ambiguous is the runtime sockets that make `--engine cri` without
// --cri-endpoint unanswerable: several exist, and asking one would miss
// the others' containers. Auto picks cri only for CRI-O's socket, which
// it then asks (cfg.Detected); the containerd sockets are the containerd
// engine's, asked beside it.
func ambiguous(cfg engine.Config, existing []string) []string {
	if cfg.CRIEndpoint != "" || cfg.Detected != "" || len(existing) < 2 {
		return nil
	}
	return existing
}

// open makes the client for one question; the caller closes it.
func (e *criEngine) open() (*Client, error) {
	if len(e.ambiguous) > 1 {
		return nil, fmt.Errorf("CRI runtime sockets at %s all exist: asking one would miss the others' containers; name the one to ask with --cri-endpoint (KC_CRI_ENDPOINT)", strings.Join(e.ambiguous, " and "))
	}
	return New(e.endpoint)
}

func (e *criEngine) Name() string     { return "cri" }
func (e *criEngine) Endpoint() string { return e.endpoint }

// Version asks the runtime's name and version.
func (e *criEngine) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.AskTimeout())
	defer cancel()
	cl, err := e.open()
	if err != nil {
		return "", err
	}
	defer cl.Close()
	name, v, err := cl.Version(ctx)
	if err != nil {
		return "", err
	}
	return name + " " + v, nil
}

// list asks every container and the init PIDs of the live ones; uid is the
// answering peer's. A status that fails leaves that container's PID 0: it
// is then followed by listing, and its liveness still comes from the list.
func (e *criEngine) list(ctx context.Context, wantPIDs func(Container) bool) (cs []engine.Container, took time.Duration, uid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.AskTimeout())
	defer cancel()
	cl, err := e.open()
	if err != nil {
		return nil, 0, engine.UIDUnknown, err
	}
	defer cl.Close()
	start := time.Now()
	xs, err := cl.List(ctx)
	if err != nil {
		return nil, 0, engine.UIDUnknown, err
	}
	cs = make([]engine.Container, len(xs))
	sem := make(chan struct{}, statusConcurrency)
	var wg sync.WaitGroup
	for i, x := range xs {
		cs[i] = engine.Container{ID: x.ID, Names: criNames(x), State: x.State, Live: x.Live, Pod: x.Pod}
		if !x.Live || !wantPIDs(x) {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if st, err := cl.Status(ctx, x.ID); err == nil && st.Live {
				cs[i].InitPID = st.PID
			}
		}()
	}
	wg.Wait()
	return cs, time.Since(start), cl.PeerUID(), nil
}

// criNames are the names --container matches: the container's CRI name,
// and namespace/pod/container where the kubelet labelled it.
func criNames(x Container) []string {
	var out []string
	if x.Name != "" {
		out = append(out, x.Name)
	}
	if x.Pod != "" {
		out = append(out, x.Pod)
	}
	return out
}

// Live lists the containers whose IDs are container ID tokens (64 hex),
// with the init PID of each live one.
func (e *criEngine) Live(ctx context.Context) (engine.Answer, error) {
	cs, took, uid, err := e.list(ctx, func(x Container) bool { return containerid.Valid(x.ID) })
	if err != nil {
		return engine.Answer{}, err
	}
	if uid == engine.UIDUnknown {
		return engine.Answer{}, errors.New("the CRI runtime at " + e.endpoint + ": the answering peer's UID could not be read")
	}
	a := engine.Answer{Engine: "cri", Endpoint: e.endpoint, Source: engine.SourceAPI, UID: uid, Took: took}
	for _, c := range cs {
		if containerid.Valid(c.ID) {
			a.Containers = append(a.Containers, c)
		}
	}
	return a, nil
}

// Resolve matches ref against every container: its ID, its CRI name, or
// namespace/pod/container.
func (e *criEngine) Resolve(ctx context.Context, ref string) ([]engine.Match, error) {
	cs, _, _, err := e.list(ctx, func(x Container) bool {
		return x.ID == ref || strings.HasPrefix(x.ID, ref) || slices.Contains(criNames(x), ref)
	})
	if err != nil {
		return nil, err
	}
	return engine.MatchRef("cri", cs, ref), nil
}

// Deaths follows GetContainerEvents. A runtime that does not serve it
// (containerd 1.6) is ErrNoEvents: watch then learns deaths from the
// pinned inits and its relisting, never by reading a refusal as a drop.
func (e *criEngine) Deaths(ctx context.Context, w engine.DeathWatch) error {
	cl, err := e.open()
	if err != nil {
		return err
	}
	defer cl.Close()
	ready, done := w.ReadySignal()
	defer done()
	err = cl.Events(ctx, ready, func(ev Event) {
		if !ev.Dead() || !containerid.Valid(ev.ID) {
			return
		}
		at := ev.At
		if at.IsZero() {
			at = time.Now()
		}
		w.Death(engine.Death{Engine: "cri", ID: ev.ID, At: at})
	})
	if errors.Is(err, ErrNotServed) {
		return fmt.Errorf("%w: the CRI runtime at %s does not serve GetContainerEvents", engine.ErrNoEvents, e.endpoint)
	}
	return err
}
