package podman

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// queryAPI lists all containers (or only's) through the podman API service at ep. The
// query runs in a goroutine and queryAPI returns as soon as ctx is done,
// whatever the exchange is blocked in.
func queryAPI(ctx context.Context, ep endpoint, store storeArgs, only []string, log *slog.Logger) (engine.Set, error) {
	type result struct {
		l   listing
		uid int
		err error
	}
	start := time.Now()
	ch := make(chan result, 1) // buffered: a late answer must not block the goroutine
	go func() {
		// Nobody listening is the common case (podman.socket not enabled):
		// one dial says so before a request is built.
		if err := probe(ctx, ep); err != nil {
			ch <- result{err: fmt.Errorf("podman API %s: %w", ep.Raw, err)}
			return
		}
		l, uid, err := listAPI(ctx, ep, store, only)
		ch <- result{l, uid, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return engine.Set{}, fmt.Errorf("podman API %s: %w", ep.Raw, context.Cause(ctx))
	}
	if r.err != nil {
		return engine.Set{}, r.err
	}
	set := engine.Set{
		Source:   engine.SourceAPI,
		Live:     r.l.Live,
		States:   r.l.States,
		Names:    r.l.Names,
		PIDs:     r.l.PIDs,
		UID:      r.uid,
		Endpoint: ep.Raw,
		Took:     time.Since(start),
	}
	log.Debug("podman API answered", "url", ep.Raw, "containers", len(set.States), "live", len(set.Live), "uid", set.UID, "took", set.Took)
	return set, nil
}

// libpodAPI is the libpod API version the queries are asked under: 4.0.0
// is the oldest the paths exist in; podman 4.x and 5.x serve them
// unchanged.
const libpodAPI = "/v4.0.0/libpod"

// maxAPIBody caps an answer: a service that streams without end must not
// grow the janitor. A list of 64 MiB is some 100,000 containers.
const maxAPIBody = 64 << 20

// listAPI lists all containers (GET /containers/json?all=true), or those
// only names (the list's id filter). Over a
// unix socket the request goes through a peercred transport, so the UID
// returned is the peer of the connection that answered (UIDUnknown for
// tcp). With store set, the service's own store paths (GET /info) must
// be the ones named, or the answer is not about the store the caller
// asked for.
func listAPI(ctx context.Context, ep endpoint, store storeArgs, only []string) (listing, int, error) {
	uri := ep.Raw
	hc, uidOf := ep.Client("podman's API socket")
	defer hc.CloseIdleConnections()
	if err := checkStore(ctx, hc, uri, store); err != nil {
		return listing{}, engine.UIDUnknown, err
	}
	body, err := getAPI(ctx, hc, "/containers/json?all=true"+engine.IDFilter(only))
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: list containers: %w", uri, err)
	}
	// The service sends [] for no containers; null is not its answer,
	// and taken for one would make every tree look stray.
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: list containers: answered null, not a list", uri)
	}
	// The service answers with the entries `podman ps --format json`
	// prints.
	l, err := parseCLI(body)
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: list containers: %w", uri, err)
	}
	uid, err := uidOf()
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w", uri, err)
	}
	return l, uid, nil
}

// checkStore checks, when store names one, that the service at uri
// (through hc) serves that store (GET /info): its answers are not about
// the store the caller asked for otherwise (errOtherStore).
func checkStore(ctx context.Context, hc *http.Client, uri string, store storeArgs) error {
	if store.empty() {
		return nil
	}
	var info struct {
		Store *struct {
			GraphRoot string `json:"graphRoot"`
			RunRoot   string `json:"runRoot"`
		} `json:"store"`
	}
	body, err := getAPI(ctx, hc, "/info")
	if err == nil {
		err = json.Unmarshal(body, &info)
	}
	if err != nil {
		return fmt.Errorf("podman API %s: info (to check --podman-arg's store): %w", uri, err)
	}
	if info.Store == nil {
		return fmt.Errorf("podman API %s: info has no store", uri)
	}
	if err := store.check(info.Store.GraphRoot, info.Store.RunRoot); err != nil {
		return fmt.Errorf("podman API %s: %w: %w", uri, errOtherStore, err)
	}
	return nil
}

// getAPI asks the libpod API for path and returns the body of a 200
// answer, at most maxAPIBody bytes of it.
func getAPI(ctx context.Context, hc *http.Client, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://d"+libpodAPI+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		// The method and URL http adds are ours, not news to the operator.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxAPIBody {
		return nil, fmt.Errorf("answer larger than %d bytes", maxAPIBody)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %d: %s", resp.StatusCode, engine.APIMessage(body))
	}
	return body, nil
}

// probe connects to ep once and hangs up. A unix socket is reached the
// way the query will reach it: a symlinked path is refused.
func probe(ctx context.Context, ep endpoint) error {
	if ep.Network == "unix" {
		c, _, err := peercred.DialUnixAs(ctx, "podman's API socket", ep.Addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	u, err := url.Parse(ep.Raw)
	if err != nil {
		return err
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	return c.Close()
}
