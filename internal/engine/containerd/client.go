// Package containerd is containerd's engine client: it asks a containerd
// daemon, through the gRPC services of containerd's api module, which
// containers exist in which namespaces, which of them have a live task
// (and its PID), and reports task exits and deletions as they happen.
//
// It speaks the api module's gRPC services directly rather than through
// containerd's full Go client: the full client (containerd/v2/client)
// would pull in much of containerd for the few calls the janitor makes,
// and the services alone are all it asks for. They are
// wire-compatible with containerd 1.6 (Debian 12's 1.6.20 is tested) and
// later. The namespace of each call travels as the gRPC metadata key
// "containerd-namespace", as containerd's own client sends it.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/grpcunix"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"
)

// DefaultAddress is containerd's default gRPC socket.
const DefaultAddress = "/run/containerd/containerd.sock"

// namespaceKey is the gRPC metadata key containerd reads a call's
// namespace from.
const namespaceKey = "containerd-namespace"

// ErrAddress marks an address that cannot be a containerd socket (empty,
// relative, a URL with another scheme): a usage error.
var ErrAddress = engine.ErrSocketPath

// Client is a connection to one containerd.
type Client struct {
	address string
	conn    *grpcunix.Conn
}

// ResolveAddress applies the documented defaults to a --containerd-address
// value: empty means $CONTAINERD_ADDRESS, else DefaultAddress. A
// "unix://" prefix is accepted and dropped.
func ResolveAddress(addr string) string {
	if addr == "" {
		addr = os.Getenv("CONTAINERD_ADDRESS")
	}
	if addr == "" {
		addr = DefaultAddress
	}
	return addr
}

// CheckAddress reports whether addr can name a containerd socket: an
// absolute path, optionally written as unix:///path. It does not look at
// the file system.
func CheckAddress(addr string) (string, error) { return engine.SocketPath(addr) }

// Dial prepares a client for the containerd socket at addr. It does not
// connect: the first call does, bounded by that call's context, through
// peercred.DialUnix: a socket path that is a symlink is refused, and the
// UID the answers vouch for is the peer's on that very connection.
func Dial(addr string) (*Client, error) {
	p, err := CheckAddress(addr)
	if err != nil {
		return nil, err
	}
	// containerd's own client raises the receive limit the same way: a
	// node with thousands of containers answers List with many MiB.
	conn, err := grpcunix.Dial("containerd's socket", p, 64<<20)
	if err != nil {
		return nil, fmt.Errorf("containerd client for %s: %w", p, err)
	}
	return &Client{address: p, conn: conn}, nil
}

// Address is the socket path this client asks.
func (c *Client) Address() string { return c.address }

// PeerUID is the UID of the process that accepted the latest connection
// (SO_PEERCRED): the UID containerd's answers vouch for. engine.UIDUnknown before
// the first call.
func (c *Client) PeerUID() int { return c.conn.PeerUID() }

// Close drops the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version asks containerd's version, the cheapest question that proves the
// daemon answers.
func (c *Client) Version(ctx context.Context) (string, error) {
	r, err := versionapi.NewVersionClient(c.conn).Version(ctx, &emptypb.Empty{})
	if err != nil {
		return "", c.wrap("version", err)
	}
	return r.GetVersion(), nil
}

// wrap words a gRPC failure for an operator: which daemon, which question.
func (c *Client) wrap(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "DeadlineExceeded") {
		return fmt.Errorf("containerd at %s did not answer %s in time: %w", c.address, what, err)
	}
	return fmt.Errorf("containerd at %s: %s: %w", c.address, what, err)
}

// withNamespace returns ctx carrying ns for containerd.
func withNamespace(ctx context.Context, ns string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, namespaceKey, ns)
}
