package podman

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// podmanEventsPath is libpod's event stream. 4.0.0 is the oldest libpod
// API the path is asked under; podman 4.x and 5.x serve it unchanged.
const podmanEventsPath = "/v4.0.0/libpod/events"

// podmanDeathFilter asks for container deaths only. On a death podman
// 4.3.1 writes "died" (the exit recorded, conmon still about) and then
// "cleanup" (conmon's cleanup done) some 50 ms later: "died" is the
// earlier, and a conmon still alive then is what watch's retries wait out
// (DESIGN "Ground truth must be corroborated"); "cleanup" would only be coalesced.
const podmanDeathFilter = `{"type":["container"],"event":["died"]}`

// podmanEvent is the part of a libpod event we read; libpod sends
// Docker's shape (Type, Action, Actor.ID, timeNano).
type podmanEvent struct {
	Type     string `json:"Type"`
	Action   string `json:"Action"`
	TimeNano int64  `json:"timeNano"`
	Actor    struct {
		ID string `json:"ID"`
	} `json:"Actor"`
}

// Deaths follows libpod's event stream for "died". Without an API service
// to ask (its socket absent or refusing, the URL not unix:// or tcp://)
// it follows `podman events` instead when the CLI reads the same podman's
// store directly (see LocalCLIArgs), else it returns ErrNoEvents:
// kc-hook's poststop, or the next round, covers that host. Once a stream
// was open, a podman that cannot be followed any more is a dropped stream
// like any other, subscribed again with backoff.
func (p *podman) Deaths(ctx context.Context, w engine.DeathWatch) error {
	ep, err := engine.ParseFlagURL("podman-url", p.url)
	if err != nil {
		return p.deathsWithoutAPI(ctx, w, fmt.Errorf("podman API %s: %w", p.url, err))
	}
	hc, uidOf := ep.Client("podman's API socket")
	defer hc.CloseIdleConnections()
	// As for the list: a service of another store than --podman-arg names
	// would report another podman's deaths.
	ictx, icancel := context.WithTimeout(ctx, p.cfg.AskTimeout())
	err = checkStore(ictx, hc, ep.Raw, parseStoreArgs(p.cfg.PodmanArgs))
	icancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return p.deathsWithoutAPI(ctx, w, err)
	}
	q := url.Values{"stream": {"true"}, "filters": {podmanDeathFilter}}
	if !w.Since.IsZero() {
		// Replayed from podman's events log: the stream is open before
		// podman follows the log.
		q.Set("since", w.Since.UTC().Format(time.RFC3339Nano))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://d"+podmanEventsPath+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, stop, err := engine.OpenStream(ctx, hc, req, p.cfg.AskTimeout())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return p.deathsWithoutAPI(ctx, w, fmt.Errorf("podman API %s: %w", ep.Raw, err))
	}
	defer stop()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("podman events %s: answered %d: %s", ep.Raw, resp.StatusCode, engine.APIMessage(b))
	}
	uid, err := uidOf()
	if err != nil {
		return fmt.Errorf("podman events %s: %w", ep.Raw, err)
	}
	p.subscribed.Store(true)
	p.cfg.Log().Debug("podman event stream open", "url", ep.Raw, "uid", uid, "since", w.Since)
	if w.Ready != nil {
		w.Ready()
	}
	return readPodmanDeaths(ctx, ep.Raw, resp.Body, w)
}

// readPodmanDeaths passes each "died" of a full container ID in body to
// w.Death until body ends (an error) or ctx is done (nil).
func readPodmanDeaths(ctx context.Context, endpoint string, body io.Reader, w engine.DeathWatch) error {
	msgs := engine.NewMessages(body, engine.MaxEventMessage, w.Skipped)
	for {
		var ev podmanEvent
		if err := msgs.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("podman events %s: stream ended: %w", endpoint, err)
		}
		if ev.Type != "container" || ev.Action != "died" || !containerid.Valid(ev.Actor.ID) {
			continue
		}
		at := time.Now()
		if ev.TimeNano > 0 {
			at = time.Unix(0, ev.TimeNano)
		}
		w.Death(engine.Death{Engine: "podman", ID: ev.Actor.ID, At: at})
	}
}
