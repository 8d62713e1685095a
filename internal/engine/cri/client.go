// Package cri asks a Kubernetes CRI runtime (CRI-O, containerd's CRI
// plugin, any runtime serving k8s.io/cri-api's runtime v1) which
// containers exist, which of them run, the host PID of a container's init,
// and, where the runtime serves GetContainerEvents, which containers
// stopped (DESIGN "Engines").
//
// It speaks the CRI gRPC service directly, as the kubelet does: no
// runtime-specific client is needed, which is what makes CRI-O nodes
// (OpenShift) reachable at all. containerd 1.6 answers GetContainerEvents
// with Unimplemented on the first receive: that is ErrNotServed, a fact
// about the runtime, not a dropped stream.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/engine/grpcunix"
)

// CRIOSocket is CRI-O's socket; the containerd sockets a node may have
// are probed after it (the caller passes them: they are the containerd
// engine's knowledge).
const CRIOSocket = "/run/crio/crio.sock"

// The caps on what a runtime may send. A node with thousands of
// containers answers ListContainers with a few MiB (each carries its
// labels and annotations); one verbose status is a spec and a config.
const (
	maxListBytes   = 64 << 20
	maxStatusBytes = 4 << 20
	maxEventBytes  = 1 << 20
)

// ErrEndpoint marks an endpoint that cannot be a CRI socket: a usage error.
var ErrEndpoint = engine.ErrSocketPath

// ErrUnreachable marks a runtime that could not be connected to.
var ErrUnreachable = errors.New("CRI runtime unreachable")

// ErrNotServed is Events' answer from a runtime that does not serve
// GetContainerEvents (containerd before 1.7, older CRI-O).
var ErrNotServed = errors.New("the runtime does not serve container events")

// Container is one container the runtime listed.
type Container struct {
	ID string
	// Name is the container's metadata name (the pod spec's container
	// name when the kubelet made it).
	Name string
	// State is the CRI state: CONTAINER_CREATED, _RUNNING, _EXITED, _UNKNOWN.
	State string
	// Live: created, running and unknown are live (DESIGN "Engines"): a
	// created container's hook has run, and unknown is not dead.
	Live bool
	// Pod is namespace/pod/container from the kubelet's labels; empty
	// outside Kubernetes.
	Pod string
}

// Status is what a verbose ContainerStatus adds: the init's host PID
// (debug output; 0 once the container exited) and its cgroups path.
type Status struct {
	Container
	PID         int
	CgroupsPath string
}

// Event is a container event the runtime sent.
type Event struct {
	ID   string
	Type string // CONTAINER_STOPPED_EVENT, CONTAINER_DELETED_EVENT, ...
	At   time.Time
}

// Dead reports whether the event says the container no longer runs.
func (e Event) Dead() bool {
	return e.Type == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT.String() ||
		e.Type == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT.String()
}

// CheckEndpoint reports whether ep can name a CRI socket: an absolute
// path, optionally written unix:///path (the kubelet's
// --container-runtime-endpoint spelling). It does not look at the file
// system.
func CheckEndpoint(ep string) (string, error) { return engine.SocketPath(ep) }

// Client is a connection to one CRI runtime.
type Client struct {
	path string
	conn *grpcunix.Conn
	rs   runtimeapi.RuntimeServiceClient
}

// New prepares a client for the socket at ep. It does not connect: the
// first call does, bounded by that call's context, through peercred: a
// symlinked socket is refused, and the UID the answers vouch for is the
// peer's on that very connection.
func New(ep string) (*Client, error) {
	p, err := CheckEndpoint(ep)
	if err != nil {
		return nil, err
	}
	conn, err := grpcunix.Dial("the CRI socket", p, maxListBytes)
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", p, err)
	}
	return &Client{path: p, conn: conn, rs: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Endpoint is the socket path this client asks.
func (c *Client) Endpoint() string { return c.path }

// PeerUID is the UID of the process that accepted the latest connection.
func (c *Client) PeerUID() int { return c.conn.PeerUID() }

// Close drops the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version asks the runtime's name and version.
func (c *Client) Version(ctx context.Context) (name, version string, err error) {
	v, err := c.rs.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", "", c.wrap("Version", err)
	}
	return v.GetRuntimeName(), v.GetRuntimeVersion(), nil
}

// List asks for every container, whatever its state.
func (c *Client) List(ctx context.Context) ([]Container, error) {
	r, err := c.rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, c.wrap("ListContainers", err)
	}
	out := make([]Container, 0, len(r.GetContainers()))
	for _, x := range r.GetContainers() {
		out = append(out, container(x.GetId(), x.GetMetadata().GetName(), x.GetState(), x.GetLabels()))
	}
	return out, nil
}

// Status asks one container's verbose status. The PID is read from the
// verbose info's "pid" (containerd and CRI-O both put it there); a
// runtime that gives none leaves it 0, and the caller follows that
// container by listing instead.
func (c *Client) Status(ctx context.Context, id string) (Status, error) {
	r, err := c.rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true},
		grpc.MaxCallRecvMsgSize(maxStatusBytes))
	if err != nil {
		return Status{}, c.wrap("ContainerStatus", err)
	}
	st := r.GetStatus()
	s := Status{Container: container(st.GetId(), st.GetMetadata().GetName(), st.GetState(), st.GetLabels())}
	s.PID, s.CgroupsPath = verboseInfo(r.GetInfo()["info"])
	return s, nil
}

// verboseInfo reads the init PID and the cgroups path out of a verbose
// status's "info" JSON; anything else in it is ignored, and a document
// that does not parse yields nothing (it is debug output, not API).
func verboseInfo(doc string) (pid int, cgroupsPath string) {
	var info struct {
		PID         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if doc == "" || json.Unmarshal([]byte(doc), &info) != nil || info.PID < 0 {
		return 0, ""
	}
	return info.PID, info.RuntimeSpec.Linux.CgroupsPath
}

// Events follows GetContainerEvents until ctx is done (nil) or the stream
// drops (an error). A runtime that does not serve it answers Unimplemented
// on the first receive: ErrNotServed. The CRI stream has no acceptance
// message: ready, if not nil, is closed with the first event, the
// earliest moment the runtime shows it serves the stream.
func (c *Client) Events(ctx context.Context, ready chan<- struct{}, fn func(Event)) error {
	stream, err := c.rs.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}, grpc.MaxCallRecvMsgSize(maxEventBytes))
	if err != nil {
		return c.eventsErr(ctx, err)
	}
	first := true
	for {
		m, err := stream.Recv()
		if err != nil {
			if first && status.Code(err) == codes.Unimplemented {
				return ErrNotServed
			}
			return c.eventsErr(ctx, err)
		}
		if first {
			first = false
			if ready != nil {
				close(ready)
				ready = nil
			}
		}
		ev := Event{ID: m.GetContainerId(), Type: m.GetContainerEventType().String()}
		if ns := m.GetCreatedAt(); ns > 0 {
			ev.At = time.Unix(0, ns)
		}
		fn(ev)
	}
}

func (c *Client) eventsErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if status.Code(err) == codes.Unimplemented {
		return ErrNotServed
	}
	return c.wrap("GetContainerEvents", err)
}

func container(id, name string, st runtimeapi.ContainerState, labels map[string]string) Container {
	return Container{
		ID:    id,
		Name:  name,
		State: st.String(),
		Live:  st != runtimeapi.ContainerState_CONTAINER_EXITED,
		Pod:   engine.PodName(labels),
	}
}

// wrap words a gRPC failure for an operator: which runtime, which call.
func (c *Client) wrap(what string, err error) error {
	if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the CRI runtime at %s did not answer %s in time: %w", c.path, what, err)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		// The dial error (peercred's, in words) travels as the message.
		return fmt.Errorf("cannot reach the CRI runtime at %s: %s: %w", c.path, st.Message(), ErrUnreachable)
	}
	return fmt.Errorf("the CRI runtime at %s: %s: %w", c.path, what, err)
}
