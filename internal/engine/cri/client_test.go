package cri

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestVerboseInfo(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		pid       int
		cgroups   string
	}{
		{"containerd", `{"sandboxID":"x","pid":4242,"runtimeSpec":{"linux":{"cgroupsPath":"/k8s.io/abc"}}}`, 4242, "/k8s.io/abc"},
		{"crio", `{"pid":17,"runtimeSpec":{"linux":{"cgroupsPath":"kubepods-besteffort.slice:crio:abc"}}}`, 17, "kubepods-besteffort.slice:crio:abc"},
		{"exited", `{"pid":0}`, 0, ""},
		{"negative", `{"pid":-5}`, 0, ""},
		{"not json", `pid=5`, 0, ""},
		{"empty", ``, 0, ""},
		{"pid as string", `{"pid":"5"}`, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid, cg := verboseInfo(tc.doc)
			if pid != tc.pid || cg != tc.cgroups {
				t.Fatalf("verboseInfo(%s) = %d, %q; want %d, %q", tc.doc, pid, cg, tc.pid, tc.cgroups)
			}
		})
	}
}

func TestStatesThatAreLive(t *testing.T) {
	for st, live := range map[runtimeapi.ContainerState]bool{
		runtimeapi.ContainerState_CONTAINER_CREATED: true,
		runtimeapi.ContainerState_CONTAINER_RUNNING: true,
		runtimeapi.ContainerState_CONTAINER_UNKNOWN: true,
		runtimeapi.ContainerState_CONTAINER_EXITED:  false,
	} {
		if got := container("id", "n", st, nil).Live; got != live {
			t.Errorf("%s: live %v, want %v", st, got, live)
		}
	}
}

// fakeRuntime serves the parts of the CRI runtime service the client asks,
// over a real unix socket: what a runtime answers is decided per test.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	containers []*runtimeapi.Container
	events     []*runtimeapi.ContainerEventResponse // nil: Unimplemented
	hang       bool
}

func (f *fakeRuntime) ListContainers(ctx context.Context, _ *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &runtimeapi.ListContainersResponse{Containers: f.containers}, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	if f.events == nil {
		return f.UnimplementedRuntimeServiceServer.GetContainerEvents(nil, s)
	}
	for _, e := range f.events {
		if err := s.Send(e); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	return nil
}

func serve(t *testing.T, f *fakeRuntime) string {
	return testutil.ServeGRPC(t, func(srv *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(srv, f) })
}

func client(t *testing.T, sock string) *Client {
	t.Helper()
	c, err := New(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestListNamesPodsAndPeer(t *testing.T) {
	sock := serve(t, &fakeRuntime{containers: []*runtimeapi.Container{
		{Id: "a", Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
			Labels: map[string]string{engine.LabelPodNamespace: "ns", engine.LabelPodName: "web-0", engine.LabelContainer: "app"}},
		{Id: "b", State: runtimeapi.ContainerState_CONTAINER_EXITED},
	}})
	c := client(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || !cs[0].Live || cs[1].Live || cs[0].Pod != "ns/web-0/app" || cs[1].Pod != "" {
		t.Fatalf("List = %+v", cs)
	}
	if c.PeerUID() != os.Getuid() {
		t.Fatalf("peer UID %d, want %d", c.PeerUID(), os.Getuid())
	}
}

func TestEventsNotServedIsNotADrop(t *testing.T) {
	c := client(t, serve(t, &fakeRuntime{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Events(ctx, nil, func(Event) { t.Error("an event from a runtime that serves none") })
	if !errors.Is(err, ErrNotServed) {
		t.Fatalf("Events = %v, want ErrNotServed", err)
	}
}

func TestEventsDelivered(t *testing.T) {
	at := time.Now().Truncate(time.Microsecond)
	c := client(t, serve(t, &fakeRuntime{events: []*runtimeapi.ContainerEventResponse{
		{ContainerId: "a", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, CreatedAt: at.UnixNano()},
		{ContainerId: "a", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: at.UnixNano()},
	}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ready := make(chan struct{})
	var got []Event
	err := c.Events(ctx, ready, func(e Event) {
		got = append(got, e)
		if len(got) == 2 {
			cancel()
		}
	})
	if err != nil {
		t.Fatalf("Events after cancel = %v, want nil", err)
	}
	select {
	case <-ready:
	default:
		t.Error("ready not closed after the first event")
	}
	if len(got) != 2 || got[0].Dead() || !got[1].Dead() || !got[1].At.Equal(at) {
		t.Fatalf("events %+v", got)
	}
}

func TestUnreachableAndHungRuntime(t *testing.T) {
	t.Run("nothing listens", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "gone.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = client(t, sock).List(ctx)
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), sock) {
			t.Fatalf("List = %v; want ErrUnreachable naming %s", err, sock)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		real := serve(t, &fakeRuntime{})
		link := filepath.Join(t.TempDir(), "link.sock")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := client(t, link).List(ctx); err == nil {
			t.Fatal("a symlinked CRI socket was asked")
		}
	})
	t.Run("hangs", func(t *testing.T) {
		c := client(t, serve(t, &fakeRuntime{hang: true}))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := c.List(ctx)
		if err == nil || !strings.Contains(err.Error(), "did not answer ListContainers in time") {
			t.Fatalf("List = %v; want a deadline error", err)
		}
	})
}

// TestAmbiguousSocketsAskNothing: with no --cri-endpoint and more than one
// runtime socket on the node, asking one would miss the others'
// containers: the engine fails every question (the truth is unknown, so
// nothing is touched) instead of answering for one of them.
func TestAmbiguousSocketsAskNothing(t *testing.T) {
	sock := serve(t, &fakeRuntime{containers: []*runtimeapi.Container{
		{Id: strings.Repeat("a", 64), State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	for _, tc := range []struct {
		name      string
		ambiguous []string
		wantErr   bool
	}{
		{"one socket (control)", nil, false},
		{"two sockets", []string{sock, "/run/k3s/containerd/containerd.sock"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &criEngine{endpoint: sock, ambiguous: tc.ambiguous}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := e.Live(ctx)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Live = %+v, %v; want an error %v", a, err, tc.wantErr)
			}
			if tc.wantErr && (len(a.Containers) > 0 || !strings.Contains(err.Error(), "--cri-endpoint")) {
				t.Errorf("answer %+v, err %v: want none, and the flag to name", a, err)
			}
		})
	}
}

// TestAmbiguity: only `--engine cri` named without an endpoint refuses
// several runtime sockets; one named, or CRI-O's found by auto (the
// containerd engine asked beside it), is asked.
func TestAmbiguity(t *testing.T) {
	both := []string{CRIOSocket, "/run/containerd/containerd.sock"}
	for _, tc := range []struct {
		name     string
		cfg      engine.Config
		existing []string
		want     bool
	}{
		{"named engine, several sockets", engine.Config{}, both, true},
		{"named engine, one socket", engine.Config{}, both[:1], false},
		{"an endpoint given", engine.Config{CRIEndpoint: CRIOSocket}, both, false},
		{"picked by auto", engine.Config{Detected: CRIOSocket}, both, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ambiguous(tc.cfg, tc.existing); (len(got) > 0) != tc.want {
				t.Errorf("ambiguous = %v, want ambiguous %v", got, tc.want)
			}
		})
	}
}
