package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"

	"github.com/kc-watchman/kc-watchman/internal/liveness"
	"github.com/kc-watchman/kc-watchman/internal/peercred"
)

// DefaultDockerURL is Docker Engine's default socket.
const DefaultDockerURL = "unix:///var/run/docker.sock"

// apiURL is a parsed engine API URL: a unix socket path or a tcp address.
type apiURL struct {
	raw     string
	network string // "unix" or "tcp"
	addr    string // socket path or host:port
}

// parseAPIURL accepts unix:///path and tcp://host:port only: ssh and
// TLS would need keys and a remote shell, nothing a janitor should block
// on from cron.
func parseAPIURL(flag, raw string) (apiURL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return apiURL{}, fmt.Errorf("%w: --%s %q: %w", ErrUsage, flag, raw, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" {
			p = "/" + u.Host + u.Path
		}
		if p == "" || p == "/" {
			return apiURL{}, fmt.Errorf("%w: --%s %q: no socket path", ErrUsage, flag, raw)
		}
		return apiURL{raw: raw, network: "unix", addr: filepath.Clean(p)}, nil
	case "tcp":
		if u.Host == "" {
			return apiURL{}, fmt.Errorf("%w: --%s %q: no host", ErrUsage, flag, raw)
		}
		return apiURL{raw: raw, network: "tcp", addr: u.Host}, nil
	default:
		return apiURL{}, fmt.Errorf("%w: --%s %q: scheme %q not supported (unix:// or tcp://)", ErrUsage, flag, raw, u.Scheme)
	}
}

// CheckDockerURL refuses a --docker-url that is not unix:// or tcp://, so
// that every command can say so before it runs.
func CheckDockerURL(raw string) error {
	if raw == "" {
		return nil
	}
	_, err := parseAPIURL("docker-url", raw)
	return err
}

// client is an HTTP client for one question or subscription, and the UID
// of the peer that answered it: SO_PEERCRED of the unix connection (a
// symlinked socket is not dialled), unknown over tcp.
// what names the socket in errors ("docker's API socket").
func (u apiURL) client(what string) (*http.Client, func() (int, error)) {
	if u.network == "unix" {
		tr := peercred.NewTransportAs(what, u.addr)
		return &http.Client{Transport: tr}, tr.UID
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", u.addr)
	}, DisableCompression: true}
	return &http.Client{Transport: tr}, func() (int, error) { return liveness.UIDUnknown, nil }
}
