package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// URL is a parsed engine API URL: a unix socket path or a tcp address.
type URL struct {
	Raw     string
	Network string // "unix" or "tcp"
	Addr    string // socket path or host:port
}

// ParseURL accepts unix:///path and tcp://host:port only: ssh and TLS
// would need keys and a remote shell, nothing a janitor should block on
// from cron. Its errors start with the quoted URL; callers say whose URL
// (the flag, or the engine) before it.
func ParseURL(raw string) (URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return URL{}, fmt.Errorf("%q: %w", raw, err)
	}
	switch u.Scheme {
	case "unix":
		p := u.Path
		if u.Host != "" { // unix://relative/path, as podman accepts it
			p = "/" + u.Host + u.Path
		}
		if p == "" || p == "/" {
			return URL{}, fmt.Errorf("%q: no socket path", raw)
		}
		return URL{Raw: raw, Network: "unix", Addr: filepath.Clean(p)}, nil
	case "tcp":
		if u.Host == "" {
			return URL{}, fmt.Errorf("%q: no host", raw)
		}
		return URL{Raw: raw, Network: "tcp", Addr: u.Host}, nil
	case "":
		if strings.HasPrefix(raw, "/") {
			return URL{}, fmt.Errorf("%q: scheme \"\" not supported (unix:// or tcp://); did you mean unix://%s?", raw, raw)
		}
	}
	return URL{}, fmt.Errorf("%q: scheme %q not supported (unix:// or tcp://)", raw, u.Scheme)
}

// ParseFlagURL is ParseURL for the value of --flag: its error wraps
// ErrUsage and names the flag.
func ParseFlagURL(flag, raw string) (URL, error) {
	u, err := ParseURL(raw)
	if err != nil {
		return URL{}, fmt.Errorf("%w: --%s %w", ErrUsage, flag, err)
	}
	return u, nil
}

// Client returns an HTTP client for one question or subscription, and the
// UID of the peer that answered it: SO_PEERCRED of the unix connection (a
// symlinked socket is not dialled), unknown over tcp. what names the
// socket in errors ("docker's API socket").
func (u URL) Client(what string) (*http.Client, func() (int, error)) {
	if u.Network == "unix" {
		tr := peercred.NewTransportAs(what, u.Addr)
		return &http.Client{Transport: tr}, tr.UID
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", u.Addr)
	}, DisableCompression: true}
	return &http.Client{Transport: tr}, func() (int, error) { return UIDUnknown, nil }
}

// IDFilter is the query parameter that limits a Docker or libpod
// container list to ids ("" for none), to be put after "?all=…". libpod
// matches an ID by prefix, dockerd by its ID index and an unanchored
// regular expression: a full 64-hex ID names its container alone.
func IDFilter(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	b, err := json.Marshal(map[string][]string{"id": ids})
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	return "&filters=" + url.QueryEscape(string(b))
}
