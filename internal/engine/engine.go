// Package engine asks the container engines of a host — podman, Docker
// Engine, containerd — which containers are alive, resolves a --container
// reference to a container, and reports container deaths as they happen
// (DESIGN "Engines"). kc-janitor's ground truth is the union of the answers of
// every engine it was told (or found) to ask; kc-hook links none of this.
//
// # Layout
//
// This package holds what every engine shares and nothing of any one
// engine: the Engine interface, the ground-truth Set and ErrUnknown, Ask's
// union, --container resolution, the one API URL parser, the capped event
// message reader. Each engine is a sub-package (podman, docker,
// containerd) that imports this one and registers a Spec from its init
// function; Select and Detect (--engine auto) find the registered ones.
// The sub-packages never import each other's internals, and this package
// never imports them, so there is no cycle; whoever selects engines links
// them (internal/janitor, blank imports). peercred, the SO_PEERCRED dialer
// every engine client dials through, is a sub-package too.
//
// # Adding an engine
//
//  1. Write a sub-package implementing Engine (docker is the example). Live
//     must return the engine's whole container list or an error: an error
//     makes the truth unknown and kc-janitor touches nothing, so never
//     return a partial list. Take Answer.UID from the connection that
//     answered (peercred.Dial), never from a stat of the socket path, and
//     refuse a symlinked socket.
//  2. Register it from an init function with a Spec: Detect says whether
//     its endpoint exists on this host (what --engine auto asks), New
//     builds it from Config and returns a usage error (wrapping ErrUsage)
//     for a malformed endpoint. Link it from internal/janitor/engines.go.
//  3. Add its endpoint settings to Config, and the matching flags (with
//     their KC_* variables) in cmd/kc-janitor/engines.go.
//  4. Give it a test against the real daemon, skipped when the daemon's
//     KC_TEST_* endpoint variable is unset and failing when KC_E2E=1.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Engine is one container engine kc-janitor can ask.
type Engine interface {
	// Name is the engine's name as --engine spells it: "podman", "docker",
	// "containerd".
	Name() string
	// Endpoint is what is asked (a URL or socket address), for reports.
	Endpoint() string
	// Live lists every container the engine knows with its state. An error
	// means the engine could not be asked; callers then act on nothing.
	Live(ctx context.Context) (Answer, error)
	// Resolve returns the containers ref names: a full ID, a unique ID
	// prefix or a name. No match is an empty slice and a nil error.
	Resolve(ctx context.Context, ref string) ([]Match, error)
	// Deaths calls w.Death for each container death the engine reports
	// until ctx is done (then it returns nil) or the stream drops (an
	// error; the caller re-subscribes). An engine without an event stream
	// returns ErrNoEvents at once.
	Deaths(ctx context.Context, w DeathWatch) error
}

// ErrNoEvents is Deaths' answer from an engine that has no death events
// kc-janitor can read (podman without an API service: kc-hook's poststop,
// or the next round, does that job there).
var ErrNoEvents = errors.New("no death events from this engine")

// ErrUsage marks a configuration error (a malformed endpoint, an unknown
// engine name): kc-janitor exits 2 on it.
var ErrUsage = errors.New("usage")

// Container is one container an engine listed.
type Container struct {
	// ID is the full 64-hex ID.
	ID string
	// Names are its names, without Docker's leading "/".
	Names []string
	// State is the engine's raw state string.
	State string
	// Live says whether State counts as alive for this engine.
	Live bool
	// InitPID is the host PID of its init process when the engine said
	// (0 if not running or not told).
	InitPID int
	// Pod is namespace/pod/container when the kubelet made it (the CRI
	// labels); empty otherwise.
	Pod string
}

// InitPIDAsker is an engine whose list gives no init PID but which can be
// asked one container's (Docker's inspect, State.Pid; 0 when it is not
// running). uid is the answering peer's, as Answer.UID is the list's: an
// answer is worth what its peer's list would be.
type InitPIDAsker interface {
	InitPID(ctx context.Context, id string) (pid, uid int, err error)
}

// Answer is one engine's view of its containers at one moment.
type Answer struct {
	Engine   string
	Endpoint string
	// Source is how the engine was asked: "api" or "cli".
	Source Source
	// UID is the UID the answer is ground truth for: the peer credentials
	// of the connection that answered (UIDUnknown for tcp).
	UID        int
	Containers []Container
	Took       time.Duration
}

// LiveCount counts the live containers.
func (a Answer) LiveCount() int {
	n := 0
	for _, c := range a.Containers {
		if c.Live {
			n++
		}
	}
	return n
}

// Match is a container a --container reference resolved to.
type Match struct {
	Engine  string
	ID      string
	Names   []string
	State   string
	InitPID int
}

// Death is a container that died, as the engine reported it.
type Death struct {
	Engine string
	ID     string
	At     time.Time
	// Via is "pidfd" when the death was seen from the kernel (the init's
	// pidfd became readable), "relist" when an answer no longer listed a
	// container no pin held, "" when the engine reported it.
	Via string
	// PID is the init's host PID the kernel saw exit (Via "pidfd").
	PID int
}

// DeathWatch is what Deaths reports to.
type DeathWatch struct {
	// Since asks an engine that keeps its recent events (dockerd keeps its
	// last 256, podman its events log) to report the deaths since then too: a subscription is in
	// place some time after it was asked for, and a stream that dropped
	// was deaf until the next one. Zero is from now on. containerd keeps
	// no events: the caller catches up on its gaps by other means.
	Since time.Time
	// Ready, if set, is called once the engine accepted the subscription.
	Ready func()
	// Death is called for each death, one at a time.
	Death func(Death)
	// Skipped, if set, is told of each message passed over (reason
	// SkipTooLarge: over MaxEventMessage; SkipMalformed: not the JSON the
	// engine sends) and its size in bytes; the stream goes on.
	Skipped func(reason string, size int64)
}

// Config holds every engine's endpoint settings. The zero value asks each
// engine's default endpoint.
type Config struct {
	// PodmanURL, PodmanArgs, PodmanBin: see Options.
	PodmanURL  string
	PodmanArgs []string
	PodmanBin  string
	// DockerURL: unix:///path or tcp://host:port. Empty: $DOCKER_HOST,
	// else unix:///var/run/docker.sock.
	DockerURL string
	// ContainerdAddress: containerd's socket path (unix:// optional).
	// Empty: $CONTAINERD_ADDRESS, else /run/containerd/containerd.sock.
	ContainerdAddress string
	// ContainerdNamespaces limits containerd to these namespaces; nil is
	// every namespace.
	ContainerdNamespaces []string
	// CRIEndpoint: a CRI runtime's socket path (unix:// optional). Empty:
	// CRI-O's socket, else the first containerd socket that exists.
	CRIEndpoint string
	// Detected is the endpoint auto detection found for the engine being
	// made (Select sets it; empty when the engine was named): an engine
	// auto picked asks what was found there.
	Detected string
	// Timeout bounds one question to one engine; default
	// DefaultTimeout.
	Timeout time.Duration
	Logger  *slog.Logger
	// Found, when set, keeps what auto detection found across the
	// questions of one long-running watch (see Found).
	Found *Found
}

// Found is what auto detection found so far. An engine found once is
// still asked, at the endpoint it was found at, when its endpoint is
// missing later: a daemon restarting has no socket for a moment, and an
// auto that then left it out would take every container it runs for
// gone. Asked, it cannot answer, and the truth is unknown. Copies of a
// Config share it; safe for concurrent use.
type Found struct {
	mu sync.Mutex
	at map[string]string // engine name: endpoint
}

// NewFound returns an empty Found.
func NewFound() *Found { return &Found{at: map[string]string{}} }

// note records that n was found at ep, or returns where it was found
// first, found now or not: an engine found at another endpoint now (a
// second containerd whose socket appeared while the first restarts) is
// another engine, whose answer would call the first's containers gone.
func (f *Found) note(n, ep string, found bool) (string, bool) {
	if f == nil {
		return ep, found
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if was, ok := f.at[n]; ok {
		return was, true
	}
	if found {
		f.at[n] = ep
	}
	return ep, found
}

// AskTimeout is Timeout, or DefaultTimeout when unset.
func (c Config) AskTimeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// Log is Logger, or a logger that discards when unset.
func (c Config) Log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Spec describes a built-in engine.
type Spec struct {
	Name string
	// Detect reports whether the engine's endpoint exists on this host,
	// and which endpoint that is; --engine auto asks the engines it finds.
	Detect func(Config) (endpoint string, found bool)
	// New builds the engine; a malformed endpoint is an error wrapping
	// ErrUsage.
	New func(Config) (Engine, error)
}

var (
	specsMu sync.Mutex
	specs   = map[string]Spec{}
)

// Register adds a built-in engine; called from init functions.
func Register(s Spec) {
	specsMu.Lock()
	defer specsMu.Unlock()
	specs[s.Name] = s
}

// Known lists the names --engine accepts besides "auto".
var Known = []string{"podman", "docker", "containerd", "cri"}

// ParseNames reads an --engine value: "auto" (or empty), or a comma list
// of engine names. It returns nil for auto.
func ParseNames(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		switch {
		case p == "":
			continue
		case p == "auto":
			if strings.Count(v, ",") > 0 {
				return nil, fmt.Errorf("%w: --engine auto cannot be combined with other engines (%q)", ErrUsage, v)
			}
			return nil, nil
		case !slices.Contains(Known, p):
			return nil, fmt.Errorf("%w: --engine: unknown engine %q (auto, %s)", ErrUsage, p, strings.Join(Known, ", "))
		case slices.Contains(out, p):
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --engine %q names no engine", ErrUsage, v)
	}
	return out, nil
}

// Select builds the engines to ask: the named ones, or with names nil
// (auto) every built-in engine whose endpoint Detect finds, or that
// cfg.Found found before. Auto finding none is not an error here: Ask
// then reports the truth unknown.
func Select(names []string, cfg Config) ([]Engine, error) {
	specsMu.Lock()
	defer specsMu.Unlock()
	detected := map[string]string{}
	if names == nil {
		for _, n := range Known {
			s, ok := specs[n]
			if !ok {
				continue
			}
			now, foundNow := s.Detect(cfg)
			ep, found := cfg.Found.note(n, now, foundNow)
			switch {
			case foundNow && ep != now:
				cfg.Log().Debug("engine found elsewhere now: asked where it was found first", "engine", n, "endpoint", ep, "now", now)
			case foundNow:
				cfg.Log().Debug("engine found", "engine", n, "endpoint", ep)
			case found:
				cfg.Log().Debug("engine found before, missing now: asked there all the same", "engine", n, "endpoint", ep)
			default:
				continue
			}
			names = append(names, n)
			detected[n] = ep
		}
	}
	var out []Engine
	for _, n := range names {
		s, ok := specs[n]
		if !ok {
			return nil, fmt.Errorf("%w: --engine %s: this kc-janitor is built without that engine", ErrUsage, n)
		}
		c := cfg
		c.Detected = detected[n]
		e, err := s.New(c)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Status is one engine's line in reconcile's JSON "engines" array.
type Status struct {
	Name       string  `json:"name"`
	Endpoint   string  `json:"endpoint"`
	Source     string  `json:"source"`
	UID        int     `json:"uid"`
	Containers int     `json:"containers"`
	Live       int     `json:"live"`
	Error      *string `json:"error"`
}

// Truth is the outcome of asking every selected engine.
type Truth struct {
	// Set is the union: a container is live if any engine says so; it is
	// ground truth for the UIDs of every engine that answered.
	Set      Set
	Answers  []Answer
	Statuses []Status
	// Asked is when the question was asked: the answers say what was
	// live then, at the earliest (a narrowed answer: the first question).
	Asked time.Time
}

// Ask asks every engine at once. If any of them cannot be asked, or there
// is none to ask, the error wraps ErrUnknown and names the
// engines that failed: callers must then touch nothing. Statuses are
// filled either way.
func Ask(ctx context.Context, engines []Engine) (Truth, error) {
	return askEach(engines, func(e Engine) (Answer, error) { return e.Live(ctx) })
}

// Narrower is an Engine that can be asked about some containers only.
type Narrower interface {
	// LiveOf is Live about ids (full IDs, at least one) alone: its answer
	// lists those of them the engine knows, and perhaps others; whole
	// says it lists every container (the engine could not be asked about
	// some).
	LiveOf(ctx context.Context, ids []string) (a Answer, whole bool, err error)
}

// maxNarrow is the most IDs a narrowed question names, canary included
// (each takes some 75 bytes of its URL); an engine is asked for its whole
// list past it.
const maxNarrow = 64

// AskAbout asks every engine again, as Ask, where before is their
// earlier answer: about ids (full IDs) alone where an engine can be asked
// so (Narrower). Such an answer is before's with ids' containers as the
// engine lists them now, so the Truth is what a whole list would say of
// ids and what before said of the rest. The question also names one
// container before listed (a canary): an answer without it was not
// filtered as asked, and the engine is asked for its whole list, as it is
// when before listed no other container (nothing to check the answer
// with), or its narrowed answer came from elsewhere this time (another
// source, UID or endpoint); a whole list (podman's CLI) is taken as it
// is. An engine new since before is asked for its whole list; one of
// before missing from engines (its endpoint gone since) makes the truth
// unknown: its containers, live ones included, would drop out.
func AskAbout(ctx context.Context, engines []Engine, ids []string, before Truth) (Truth, error) {
	asked := map[string]bool{}
	for _, e := range engines {
		asked[e.Name()] = true
	}
	prev := map[string]Answer{}
	for _, a := range before.Answers {
		if !asked[a.Engine] {
			return Truth{}, fmt.Errorf("%w: %s answered the first question but was not found for the second (its endpoint gone meanwhile?)", ErrUnknown, a.Engine)
		}
		prev[a.Engine] = a
	}
	about := make(map[string]bool, len(ids))
	for _, id := range ids {
		about[id] = true
	}
	tr, err := askEach(engines, func(e Engine) (Answer, error) {
		n, ok := e.(Narrower)
		old, known := prev[e.Name()]
		// A live container makes the likelier canary: an exited one may
		// be removed before the question, which costs a third one.
		i := slices.IndexFunc(old.Containers, func(c Container) bool { return !about[c.ID] && c.Live })
		if i < 0 {
			i = slices.IndexFunc(old.Containers, func(c Container) bool { return !about[c.ID] })
		}
		if !ok || !known || len(ids) == 0 || len(ids) >= maxNarrow || i < 0 {
			return e.Live(ctx)
		}
		canary := old.Containers[i].ID
		a, whole, err := n.LiveOf(ctx, append(slices.Clone(ids), canary))
		if err != nil || whole {
			return a, err
		}
		if a.Source != old.Source || a.UID != old.UID || a.Endpoint != old.Endpoint ||
			!slices.ContainsFunc(a.Containers, func(c Container) bool { return c.ID == canary }) {
			return e.Live(ctx)
		}
		return narrowed(old, a, about), nil
	})
	// What the first answer said of the others is as old as it.
	if !before.Asked.IsZero() && before.Asked.Before(tr.Asked) {
		tr.Asked = before.Asked
	}
	return tr, err
}

// narrowed is old with the containers in about as again lists them.
func narrowed(old, again Answer, about map[string]bool) Answer {
	out := again
	out.Containers = make([]Container, 0, len(old.Containers))
	for _, c := range old.Containers {
		if !about[c.ID] {
			out.Containers = append(out.Containers, c)
		}
	}
	for _, c := range again.Containers {
		if about[c.ID] {
			out.Containers = append(out.Containers, c)
		}
	}
	return out
}

// askEach asks every engine at once through live; see Ask.
func askEach(engines []Engine, live func(Engine) (Answer, error)) (Truth, error) {
	if len(engines) == 0 {
		return Truth{}, fmt.Errorf("%w: no container engine found on this host (podman, docker, containerd, CRI-O); name one with --engine", ErrUnknown)
	}
	asked := time.Now()
	answers := make([]Answer, len(engines))
	errs := make([]error, len(engines))
	var wg sync.WaitGroup
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = live(e)
		}()
	}
	wg.Wait()

	tr := Truth{Asked: asked}
	var failed []error
	for i, e := range engines {
		st := Status{Name: e.Name(), Endpoint: e.Endpoint(), UID: UIDUnknown}
		if errs[i] != nil {
			fe := failedEngine{name: e.Name(), err: errs[i]}
			msg := fe.reason()
			st.Error = &msg
			failed = append(failed, fe)
		} else {
			a := answers[i]
			st.Source, st.UID, st.Containers, st.Live = string(a.Source), a.UID, len(a.Containers), a.LiveCount()
			if a.Endpoint != "" {
				st.Endpoint = a.Endpoint
			}
			tr.Answers = append(tr.Answers, a)
		}
		tr.Statuses = append(tr.Statuses, st)
	}
	if len(failed) > 0 {
		return tr, fmt.Errorf("%w: %w", ErrUnknown, errors.Join(failed...))
	}
	tr.Set = Union(tr.Answers)
	return tr, nil
}

// Union merges answers into one Set. Source, Endpoint and UID are
// the first answer's (reconcile's JSON "source" stays the first engine's);
// UIDs holds every answer's known UID. A container listed by answers of
// different UIDs gets its init PID from root's answers alone (see
// PIDFrom).
func Union(answers []Answer) Set {
	s := Set{
		Live:   map[string]bool{},
		States: map[string]string{},
		Names:  map[string][]string{},
		PIDs:   map[string]int{},
		Pods:   map[string]string{},
		UID:    UIDUnknown,
		UIDs:   []int{},
	}
	listers := Listers(answers)
	s.ListedBy = listers
	doubtful := map[string]bool{}
	for i, a := range answers {
		if i == 0 {
			s.Source, s.Endpoint, s.UID = a.Source, a.Endpoint, a.UID
		}
		if a.UID >= 0 && !slices.Contains(s.UIDs, a.UID) {
			s.UIDs = append(s.UIDs, a.UID)
		}
		s.Took = max(s.Took, a.Took)
		for _, c := range a.Containers {
			// A live state wins over another engine's dead one.
			if _, seen := s.States[c.ID]; !seen || c.Live {
				s.States[c.ID] = c.State
			}
			if c.Live {
				s.Live[c.ID] = true
			}
			if len(c.Names) > 0 {
				s.Names[c.ID] = c.Names
			}
			if c.Pod != "" {
				s.Pods[c.ID] = c.Pod
			}
			if c.InitPID > 0 && PIDFrom(listers, a, c.ID) {
				if old, ok := s.PIDs[c.ID]; ok && old != c.InitPID {
					doubtful[c.ID] = true
				}
				s.PIDs[c.ID] = c.InitPID
			}
		}
	}
	// Two inits named for one container: neither is taken.
	for id := range doubtful {
		delete(s.PIDs, id)
	}
	sort.Ints(s.UIDs)
	return s
}

// Listers maps each container ID the answers list to the UIDs of the
// answers listing it (UIDUnknown included).
func Listers(answers []Answer) map[string][]int {
	m := map[string][]int{}
	for _, a := range answers {
		for _, c := range a.Containers {
			if !slices.Contains(m[c.ID], a.UID) {
				m[c.ID] = append(m[c.ID], a.UID)
			}
		}
	}
	return m
}

// PIDFrom reports whether a's init PID for container id may be taken: a
// user's engine can list a container of root's by its ID, naming as its
// init a process of his own, whose death would then call root's
// container gone. Where answers of more than one UID list the
// container, only root's answers name its init.
func PIDFrom(listers map[string][]int, a Answer, id string) bool {
	uids := listers[id]
	return len(uids) == 1 || a.UID == 0
}

// MatchRef picks from cs the containers ref names, in this order: the
// container whose full ID is ref, else those with ref as a name or as
// their Kubernetes namespace/pod/container, else those whose ID starts
// with ref. Engines use it to implement Resolve.
func MatchRef(engine string, cs []Container, ref string) []Match {
	pick := func(ok func(Container) bool) []Match {
		var out []Match
		for _, c := range cs {
			if ok(c) {
				out = append(out, Match{Engine: engine, ID: c.ID, Names: c.Names, State: c.State, InitPID: c.InitPID})
			}
		}
		return out
	}
	if m := pick(func(c Container) bool { return c.ID == ref }); len(m) > 0 {
		return m
	}
	named := func(c Container) bool { return slices.Contains(c.Names, ref) || (c.Pod != "" && c.Pod == ref) }
	if m := pick(named); len(m) > 0 {
		// A pod's container restarted keeps its exited attempts (the
		// kubelet's), all of the same name: the live one is meant.
		if live := pick(func(c Container) bool { return named(c) && c.Live }); len(m) > 1 && len(live) > 0 {
			return live
		}
		return m
	}
	return pick(func(c Container) bool { return strings.HasPrefix(c.ID, ref) })
}

// failedEngine is an engine that could not be asked, as the union reports
// it: its name, then why, without the "ground truth unknown" the union
// says once for all of them.
type failedEngine struct {
	name string
	err  error
}

func (f failedEngine) reason() string {
	return strings.TrimPrefix(f.err.Error(), ErrUnknown.Error()+": ")
}

func (f failedEngine) Error() string { return f.name + ": " + f.reason() }
func (f failedEngine) Unwrap() error { return f.err }
