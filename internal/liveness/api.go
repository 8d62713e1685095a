package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
)

// queryAPI lists all containers through the podman API service at ep. The
// bindings honour ctx for the HTTP exchange but sleep between their own
// retries regardless of it, so the call runs in a goroutine and queryAPI
// returns as soon as ctx is done.
func queryAPI(ctx context.Context, ep endpoint, log *slog.Logger) (Set, error) {
	type result struct {
		l   listing
		err error
	}
	start := time.Now()
	ch := make(chan result, 1) // buffered: a late answer must not block the goroutine
	go func() {
		// Nobody listening is the common case (podman.socket not enabled):
		// find out with one dial rather than through the bindings, which
		// retry three times with pauses in between.
		if err := probe(ctx, ep); err != nil {
			ch <- result{err: fmt.Errorf("podman API %s: %w", ep.raw, err)}
			return
		}
		l, err := listAPI(ctx, ep.raw)
		ch <- result{l, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return Set{}, fmt.Errorf("podman API %s: %w", ep.raw, context.Cause(ctx))
	}
	if r.err != nil {
		return Set{}, r.err
	}
	logIgnored(log, SourceAPI, r.l.Ignored)
	set := Set{
		Source:   SourceAPI,
		Live:     r.l.Live,
		States:   r.l.States,
		Names:    r.l.Names,
		PIDs:     r.l.PIDs,
		Ignored:  r.l.Ignored,
		UID:      ep.owner(),
		Endpoint: ep.raw,
		Took:     time.Since(start),
	}
	log.Debug("podman API answered", "url", ep.raw, "containers", len(set.States), "live", len(set.Live), "uid", set.UID, "took", set.Took)
	return set, nil
}

// listAPI is the bindings call proper.
func listAPI(ctx context.Context, uri string) (listing, error) {
	cctx, err := bindings.NewConnection(ctx, uri)
	if err != nil {
		return listing{}, fmt.Errorf("podman API %s: %w", uri, err)
	}
	if conn, err := bindings.GetClient(cctx); err == nil {
		// Each connection has its own transport; don't leave its keep-alive
		// connection to the service open after every query.
		defer conn.Client.CloseIdleConnections()
	}
	list, err := containers.List(cctx, new(containers.ListOptions).WithAll(true))
	if err != nil {
		return listing{}, fmt.Errorf("podman API %s: list containers: %w", uri, err)
	}
	es := make([]entry, 0, len(list))
	for _, c := range list {
		es = append(es, entry{ID: c.ID, State: c.State, Names: c.Names, PID: c.Pid})
	}
	l, err := fromEntries(es)
	if err != nil {
		return listing{}, fmt.Errorf("podman API %s: %w", uri, err)
	}
	return l, nil
}

// probe connects to ep once and hangs up.
func probe(ctx context.Context, ep endpoint) error {
	network, addr := "unix", ep.path
	if ep.scheme == "tcp" {
		u, err := url.Parse(ep.raw)
		if err != nil {
			return err
		}
		network, addr = "tcp", u.Host
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// socketOwner returns the UID owning the file at path (following symlinks,
// as connecting does).
func socketOwner(path string) (int, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return UIDUnknown, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return UIDUnknown, fmt.Errorf("%s: no owner information", path)
	}
	return int(st.Uid), nil
}
