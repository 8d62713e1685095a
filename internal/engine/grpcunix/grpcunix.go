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
	"sync"
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
	peers peers
}

// peers is the UID that accepted every connection so far. gRPC dials
// again when a connection drops, and a question of several calls
// (containerd's namespaces, then each one's containers and tasks) may
// then be answered partly by another process at the same path: its
// answers pieced together vouch for no one.
type peers struct {
	mu     sync.Mutex
	uid    int
	dialed bool
}

func (p *peers) record(uid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.dialed:
		p.uid, p.dialed = uid, true
	case p.uid != uid:
		p.uid = peercred.UIDUnknown
	}
}

func (p *peers) UID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dialed {
		return peercred.UIDUnknown
	}
	return p.uid
}

// Dial prepares a connection to the socket at path, which what names in
// errors ("containerd's socket"), accepting answers of up to maxRecv
// bytes. It does not connect: the first call does, bounded by that call's
// context.
func Dial(what, path string, maxRecv int) (*Conn, error) {
	c := &Conn{}
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		conn, uid, err := peercred.DialUnixAs(ctx, what, path)
		if err != nil {
			return nil, err
		}
		c.peers.record(uid)
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

// PeerUID is the UID of the process that accepted every connection so
// far (SO_PEERCRED); peercred.UIDUnknown before the first, and once two
// were accepted by different UIDs.
func (c *Conn) PeerUID() int { return c.peers.UID() }
