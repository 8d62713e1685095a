package podman

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/bindings/system"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// queryAPI lists all containers through the podman API service at ep. The
// bindings honour ctx for the HTTP exchange but sleep between their own
// retries regardless of it, so the call runs in a goroutine and queryAPI
// returns as soon as ctx is done.
func queryAPI(ctx context.Context, ep endpoint, store storeArgs, log *slog.Logger) (engine.Set, error) {
	type result struct {
		l   listing
		uid int
		err error
	}
	start := time.Now()
	ch := make(chan result, 1) // buffered: a late answer must not block the goroutine
	go func() {
		// Nobody listening is the common case (podman.socket not enabled):
		// find out with one dial rather than through the bindings, which
		// retry three times with pauses in between.
		if err := probe(ctx, ep); err != nil {
			ch <- result{err: fmt.Errorf("podman API %s: %w", ep.Raw, err)}
			return
		}
		l, uid, err := listAPI(ctx, ep, store)
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
	logIgnored(log, engine.SourceAPI, r.l.Ignored)
	set := engine.Set{
		Source:   engine.SourceAPI,
		Live:     r.l.Live,
		States:   r.l.States,
		Names:    r.l.Names,
		PIDs:     r.l.PIDs,
		Ignored:  r.l.Ignored,
		UID:      r.uid,
		Endpoint: ep.Raw,
		Took:     time.Since(start),
	}
	log.Debug("podman API answered", "url", ep.Raw, "containers", len(set.States), "live", len(set.Live), "uid", set.UID, "took", set.Took)
	return set, nil
}

// listAPI is the bindings call proper. Over a unix socket every request
// goes through a peercred transport, so the UID returned is the peer of
// the connections that answered (UIDUnknown for tcp). With store set, the
// service's own store paths (GET /info) must be the ones named, or the
// answer is not about the store the caller asked for.
func listAPI(ctx context.Context, ep endpoint, store storeArgs) (listing, int, error) {
	uri := ep.Raw
	cctx, err := bindings.NewConnection(ctx, uri)
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w", uri, err)
	}
	conn, err := bindings.GetClient(cctx)
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w", uri, err)
	}
	// Each connection has its own transport; don't leave its keep-alive
	// connection to the service open after every query.
	conn.Client.CloseIdleConnections()
	uidOf := func() (int, error) { return engine.UIDUnknown, nil }
	if ep.Network == "unix" {
		tr := peercred.NewTransportAs("podman's API socket", ep.Addr)
		conn.Client.Transport = tr
		uidOf = tr.UID
	}
	defer conn.Client.CloseIdleConnections()
	if !store.empty() {
		info, err := system.Info(cctx, nil)
		if err != nil {
			return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: info (to check --podman-arg's store): %w", uri, err)
		}
		if info.Store == nil {
			return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: info has no store", uri)
		}
		if err := store.check(info.Store.GraphRoot, info.Store.RunRoot); err != nil {
			return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w: %w", uri, errOtherStore, err)
		}
	}
	list, err := containers.List(cctx, new(containers.ListOptions).WithAll(true))
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: list containers: %w", uri, err)
	}
	es := make([]entry, 0, len(list))
	for _, c := range list {
		es = append(es, entry{ID: c.ID, State: c.State, Names: c.Names, PID: c.Pid})
	}
	l, err := fromEntries(es)
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w", uri, err)
	}
	uid, err := uidOf()
	if err != nil {
		return listing{}, engine.UIDUnknown, fmt.Errorf("podman API %s: %w", uri, err)
	}
	return l, uid, nil
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
