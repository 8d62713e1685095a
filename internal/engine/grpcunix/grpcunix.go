// Package grpcunix connects to the engines that answer gRPC on a Unix
// socket (containerd, a CRI runtime) the way kc-watchman trusts a socket:
// through peercred, so that a socket path that is a symlink is refused
// and the UID the answers vouch for is the peer's on that very
// connection.
package grpcunix

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/kc-watchman/kc-watchman/internal/engine/peercred"
)

// Keepalive pings the engine on a connection with a call open (watch's
// event stream: an engine that stopped answering, SIGSTOPped or wedged,
// would otherwise leave it deaf and open for ever) and drops the
// connection when a ping goes unanswered. containerd (1.6, 1.7, 2.x) and
// the CRI runtimes build their gRPC servers with no keepalive options, so
// grpc-go's default enforcement policy holds: pings less than 5 minutes
// apart are strikes, the third a GOAWAY "too_many_pings", and none
// without an open stream. 6 minutes keeps clear of that with room for
// timer slack; idle connections are not pinged.
var Keepalive = keepalive.ClientParameters{Time: 6 * time.Minute, Timeout: 20 * time.Second, PermitWithoutStream: false}

// Conn is a client connection to one engine socket.
type Conn struct {
	*grpc.ClientConn
	peerUID atomic.Int64
}

// Dial prepares a connection to the socket at path, which what names in
// errors ("containerd's socket"), accepting answers of up to maxRecv
// bytes. It does not connect: the first call does, bounded by that call's
// context.
func Dial(what, path string, maxRecv int) (*Conn, error) {
	c := &Conn{}
	c.peerUID.Store(peercred.UIDUnknown)
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		conn, uid, err := peercred.DialUnixAs(ctx, what, path)
		if err != nil {
			c.peerUID.Store(peercred.UIDUnknown)
			return nil, err
		}
		c.peerUID.Store(int64(uid))
		return conn, nil
	}
	// The target is never resolved: the dialer ignores it.
	conn, err := grpc.NewClient("passthrough:///engine",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithAuthority("localhost"),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecv)),
		grpc.WithKeepaliveParams(Keepalive),
	)
	if err != nil {
		return nil, fmt.Errorf("gRPC client for %s: %w", path, err)
	}
	c.ClientConn = conn
	return c, nil
}

// PeerUID is the UID of the process that accepted the latest connection
// (SO_PEERCRED), peercred.UIDUnknown before the first call.
func (c *Conn) PeerUID() int { return int(c.peerUID.Load()) }
