// Package docker is Docker Engine's client: a small HTTP client of its own
// over the Engine API socket (containers/json, containers/{id}/json,
// events, version), each connection dialled by peercred.
package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

func init() {
	engine.Register(engine.Spec{Name: "docker", Detect: detectDocker, New: New})
}

// dockerAPI is the Engine API version asked for first: dockerd 20.10
// speaks up to 1.41. Docker 29 refuses anything below 1.44, saying which
// it accepts (minimumAPI); the client then asks in that version from then
// on. The fields read (Id, State, State.Pid, Running, Restarting; an
// event's Type, Action, Actor.ID, timeNano) are the same in both.
const dockerAPI = "/v1.41"

// tooOld is dockerd's refusal of an API version below its minimum (moby's
// versionUnsupportedError, status 400).
var tooOld = regexp.MustCompile(`^client version \S+ is too old\. Minimum supported API version is (1\.[0-9]{1,3})\b`)

// minimumAPI is the version prefix dockerd's refusal names as its
// minimum, if err is that refusal.
func minimumAPI(err error) (string, bool) {
	se := (*dockerStatusError)(nil)
	if !errors.As(err, &se) || se.code != http.StatusBadRequest {
		return "", false
	}
	m := tooOld.FindStringSubmatch(se.msg)
	if m == nil {
		return "", false
	}
	return "/v" + m[1], true
}

// maxDockerBody bounds an answer read into memory (a container list of
// tens of thousands of entries fits easily).
const maxDockerBody = 64 << 20

// dockerLiveStates are Docker's container states whose trees are not
// stray: a restarting container's tree is between two runs, and a created
// one's may be started before the container is (DESIGN "Engines").
var dockerLiveStates = map[string]bool{"created": true, "running": true, "paused": true, "restarting": true}

// dockerStates are every state Docker reports; anything else means we are
// not reading the API we think we are.
var dockerStates = map[string]bool{"created": true, "running": true, "paused": true, "restarting": true, "removing": true, "exited": true, "dead": true}

// DefaultURL is Docker Engine's default socket.
const DefaultURL = "unix:///var/run/docker.sock"

// CheckURL refuses a --docker-url that is not unix:// or tcp://, so that
// every command can say so before it runs.
func CheckURL(raw string) error {
	if raw == "" {
		return nil
	}
	_, err := engine.ParseFlagURL("docker-url", raw)
	return err
}

// docker asks Docker Engine through its HTTP API: a small client of our
// own over the socket, so that every connection is made (and its peer's
// UID read) by peercred.
type docker struct {
	cfg engine.Config
	ep  engine.URL
	// api is the version prefix dockerd accepted (nil: dockerAPI).
	api atomic.Pointer[string]
}

func (d *docker) apiPrefix() string {
	if v := d.api.Load(); v != nil {
		return *v
	}
	return dockerAPI
}

// newerAPI takes up the minimum version dockerd's refusal err names and
// says whether a question asked in another version is worth asking again.
func (d *docker) newerAPI(err error) bool {
	v, ok := minimumAPI(err)
	if !ok || v == d.apiPrefix() {
		return false
	}
	d.api.Store(&v)
	return true
}

func dockerURL(cfg engine.Config) string {
	if cfg.DockerURL != "" {
		return cfg.DockerURL
	}
	if env := os.Getenv("DOCKER_HOST"); env != "" {
		return env
	}
	return DefaultURL
}

func New(cfg engine.Config) (engine.Engine, error) {
	ep, err := engine.ParseFlagURL("docker-url", dockerURL(cfg))
	if err != nil {
		return nil, err
	}
	return &docker{cfg: cfg, ep: ep}, nil
}

// detectDocker finds Docker when a URL was given or its socket exists (a
// symlink too: asking it will refuse it, loudly, rather than auto quietly
// leaving Docker out).
func detectDocker(cfg engine.Config) (string, bool) {
	raw := dockerURL(cfg)
	if cfg.DockerURL != "" || os.Getenv("DOCKER_HOST") != "" {
		return raw, true
	}
	ep, err := engine.ParseFlagURL("docker-url", raw)
	if err != nil {
		return raw, true
	}
	return raw, len(engine.Existing([]string{ep.Addr})) > 0
}

func (d *docker) Name() string     { return "docker" }
func (d *docker) Endpoint() string { return d.ep.Raw }

// client returns an HTTP client for one question and a function giving
// the UID the answering peer runs as.
func (d *docker) client() (*http.Client, func() (int, error)) {
	return d.ep.Client("docker's API socket")
}

// get asks path and decodes the JSON answer into v; asked in a version
// dockerd no longer speaks, once more in the one it names.
func (d *docker) get(ctx context.Context, hc *http.Client, path string, v any) error {
	err := d.getIn(ctx, hc, d.apiPrefix(), path, v)
	if d.newerAPI(err) {
		err = d.getIn(ctx, hc, d.apiPrefix(), path, v)
	}
	return err
}

func (d *docker) getIn(ctx context.Context, hc *http.Client, api, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker"+api+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return d.askErr(ctx, "asking "+path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDockerBody+1))
	if err != nil {
		return d.askErr(ctx, "reading "+path, err)
	}
	if len(body) > maxDockerBody {
		return fmt.Errorf("docker API %s: %s: answer larger than %d bytes", d.ep.Raw, path, maxDockerBody)
	}
	if resp.StatusCode != http.StatusOK {
		return &dockerStatusError{code: resp.StatusCode, msg: engine.APIMessage(body)}
	}
	if err := json.Unmarshal(body, v); err != nil {
		if le := (*listError)(nil); errors.As(err, &le) {
			return fmt.Errorf("docker API %s: %w", d.ep.Raw, le)
		}
		return fmt.Errorf("docker API %s: %s: not the JSON Docker sends: %w", d.ep.Raw, path, err)
	}
	return nil
}

// askErr words a failed question for the operator: a dockerd that
// accepts and never answers shows as the bound it ran into, not as Go's
// "context deadline exceeded".
func (d *docker) askErr(ctx context.Context, what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("docker API %s: %s: no answer within %v (--podman-timeout): %w", d.ep.Raw, what, d.cfg.AskTimeout(), context.DeadlineExceeded)
	}
	// The method and URL http adds are ours, not news to the operator.
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("docker API %s: %s: %w", d.ep.Raw, what, err)
}

type dockerStatusError struct {
	code int
	msg  string
}

func (e *dockerStatusError) Error() string {
	return fmt.Sprintf("docker API answered %d: %s", e.code, e.msg)
}

type dockerListEntry struct {
	ID    *string  `json:"Id"`
	Names []string `json:"Names"`
	State *string  `json:"State"`
}

// listError is an entry of a container list that Docker would not send.
type listError struct{ msg string }

func (e *listError) Error() string { return e.msg }

// dockerList is a /containers/json answer, decoded one entry at a time
// and each checked as it comes: an entry of "{}" is 3 bytes of the answer
// and a struct once decoded, and the first entry without a full ID or
// with a state Docker never reports fails the whole answer (a list we
// cannot read entirely is not ground truth).
type dockerList struct {
	containers []engine.Container
	null       bool
}

func (l *dockerList) UnmarshalJSON(data []byte) error {
	if bytes.Equal(data, []byte("null")) {
		l.null = true
		return nil
	}
	// The decoder calling this has checked the syntax of all of data.
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return errors.New("not a list")
	}
	var e dockerListEntry
	for i := 0; dec.More(); i++ {
		e = dockerListEntry{}
		if err := dec.Decode(&e); err != nil {
			return &listError{fmt.Sprintf("entry %d: not the JSON Docker sends: %v", i, err)}
		}
		if e.ID == nil || !containerid.Valid(*e.ID) {
			return &listError{fmt.Sprintf("entry %d has no full container ID", i)}
		}
		if e.State == nil || !dockerStates[*e.State] {
			return &listError{fmt.Sprintf("container %s: unknown state %.40q", *e.ID, deref(e.State))}
		}
		names := make([]string, 0, len(e.Names))
		for _, n := range e.Names {
			names = append(names, strings.TrimPrefix(n, "/"))
		}
		l.containers = append(l.containers, engine.Container{ID: *e.ID, Names: names, State: *e.State, Live: dockerLiveStates[*e.State]})
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}

// list asks for every container, or for those ids name (the list's id
// filter).
func (d *docker) list(ctx context.Context, ids []string) (engine.Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AskTimeout())
	defer cancel()
	start := time.Now()
	hc, uidOf := d.client()
	defer hc.CloseIdleConnections()
	var raw dockerList
	if err := d.get(ctx, hc, "/containers/json?all=1"+engine.IDFilter(ids), &raw); err != nil {
		return engine.Answer{}, err
	}
	if raw.null {
		return engine.Answer{}, fmt.Errorf("docker API %s: containers/json answered null, not a list", d.ep.Raw)
	}
	a := engine.Answer{Engine: "docker", Endpoint: d.ep.Raw, Source: engine.SourceAPI, Took: time.Since(start), Containers: raw.containers}
	uid, err := uidOf()
	if err != nil {
		return engine.Answer{}, fmt.Errorf("docker API %s: %w", d.ep.Raw, err)
	}
	a.UID = uid
	return a, nil
}

func (d *docker) Live(ctx context.Context) (engine.Answer, error) { return d.list(ctx, nil) }

// LiveOf lists the containers ids name through the list's id filter.
func (d *docker) LiveOf(ctx context.Context, ids []string) (engine.Answer, bool, error) {
	a, err := d.list(ctx, ids)
	return a, false, err
}

// Resolve matches ref against the full list (so that an ambiguous prefix
// names every candidate) and asks each match's init PID.
func (d *docker) Resolve(ctx context.Context, ref string) ([]engine.Match, error) {
	a, err := d.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	ms := engine.MatchRef("docker", a.Containers, ref)
	if len(ms) != 1 {
		return ms, nil
	}
	pid, _, err := d.InitPID(ctx, ms[0].ID)
	if err != nil {
		return nil, err
	}
	ms[0].InitPID = pid
	return ms, nil
}

// InitPID is State.Pid of one container (0 when it is not running): the
// list gives none, so watch asks it of each live container it pins. uid
// is the answering dockerd's (SO_PEERCRED), checked by the caller as the
// list's is.
func (d *docker) InitPID(ctx context.Context, id string) (pid, uid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AskTimeout())
	defer cancel()
	hc, uidOf := d.client()
	defer hc.CloseIdleConnections()
	var in struct {
		ID    string `json:"Id"`
		State *struct {
			Pid        int   `json:"Pid"`
			Running    *bool `json:"Running"`
			Restarting *bool `json:"Restarting"`
		} `json:"State"`
	}
	if err := d.get(ctx, hc, "/containers/"+url.PathEscape(id)+"/json", &in); err != nil {
		return 0, engine.UIDUnknown, err
	}
	if in.ID != id || in.State == nil || in.State.Running == nil {
		return 0, engine.UIDUnknown, fmt.Errorf("docker API %s: inspect %s answered another container or no state", d.ep.Raw, id)
	}
	if uid, err = uidOf(); err != nil {
		return 0, engine.UIDUnknown, fmt.Errorf("docker API %s: %w", d.ep.Raw, err)
	}
	// A container in its restart policy's backoff has no init (Pid 0)
	// and is live all the same: 0 must mean "not running" only.
	if in.State.Restarting != nil && *in.State.Restarting {
		return 0, uid, fmt.Errorf("docker API %s: container %s is restarting: %w", d.ep.Raw, id, errRestarting)
	}
	if !*in.State.Running {
		return 0, uid, nil
	}
	if in.State.Pid <= 0 {
		// Running with no init to name: not an answer a death may be
		// decided on (0 would read as "not running").
		return 0, uid, fmt.Errorf("docker API %s: container %s is running with no init PID", d.ep.Raw, id)
	}
	return in.State.Pid, uid, nil
}

// errRestarting: a restarting container has no init PID to give.
var errRestarting = errors.New("no init while restarting")

// dockerEvent is the part of an /events message we read.
type dockerEvent struct {
	Type     string `json:"Type"`
	Action   string `json:"Action"`
	TimeNano int64  `json:"timeNano"`
	Actor    struct {
		ID string `json:"ID"`
	} `json:"Actor"`
}

// events opens the /events stream with query q and checks its status.
func (d *docker) events(ctx context.Context, hc *http.Client, q url.Values) (*http.Response, context.CancelFunc, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker"+d.apiPrefix()+"/events?"+q.Encode(), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, stop, err := engine.OpenStream(ctx, hc, req, d.cfg.AskTimeout())
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		stop()
		return nil, nil, &dockerStatusError{code: resp.StatusCode, msg: engine.APIMessage(b)}
	}
	return resp, stop, nil
}

// Deaths follows /events for container "die" messages. dockerd answers
// the request's headers before it subscribes; w.Since (replayed from its
// buffer under the same lock as the subscription) closes that gap.
func (d *docker) Deaths(ctx context.Context, w engine.DeathWatch) error {
	hc, _ := d.client()
	defer hc.CloseIdleConnections()
	q := url.Values{"filters": {`{"type":["container"],"event":["die"]}`}}
	if !w.Since.IsZero() {
		q.Set("since", fmt.Sprintf("%d.%09d", w.Since.Unix(), w.Since.Nanosecond()))
	}
	resp, stop, err := d.events(ctx, hc, q)
	if d.newerAPI(err) {
		resp, stop, err = d.events(ctx, hc, q)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("docker events %s: %w", d.ep.Raw, err)
	}
	defer stop()
	defer resp.Body.Close()
	if w.Ready != nil {
		w.Ready()
	}
	msgs := engine.NewMessages(resp.Body, engine.MaxEventMessage, w.Skipped)
	for {
		var ev dockerEvent
		if err := msgs.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("docker events %s: stream ended: %w", d.ep.Raw, err)
		}
		if ev.Type != "container" || ev.Action != "die" || !containerid.Valid(ev.Actor.ID) {
			continue
		}
		at := time.Now()
		if ev.TimeNano > 0 {
			at = time.Unix(0, ev.TimeNano)
		}
		w.Death(engine.Death{Engine: "docker", ID: ev.Actor.ID, At: at})
	}
}
