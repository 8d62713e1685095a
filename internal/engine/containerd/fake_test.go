package containerd

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	namespacesapi "github.com/containerd/containerd/api/services/namespaces/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeState is what a fake containerd answers: one namespace, its
// container records, its tasks, and the errors to give instead. It stands
// in for what the private containerd cannot be made to do on demand: fail
// a task Get (a shim that does not reply is reported with status unknown
// after containerd's own deadline), so the fallback for a Get that fails
// is reachable only here.
type fakeState struct {
	mu         sync.Mutex
	containers []string
	tasks      map[string]tasktypes.Status
	getErr     map[string]codes.Code // a task Get fails with this code
	listErr    codes.Code            // the task List fails (codes.OK: it does not)
	gets       []string              // the IDs asked alone, in order
	lists      int
	// stream: the containers service serves ListStream too (containerd
	// does; without it, the client asks List).
	stream bool
	// labels are every container's.
	labels map[string]string
}

// fakeContainerd is the containerd engine asking a fake containerd
// serving st.
func fakeContainerd(t *testing.T, st *fakeState) engine.Engine {
	t.Helper()
	e, err := New(engine.Config{ContainerdAddress: testutil.ServeGRPC(t, func(srv *grpc.Server) {
		namespacesapi.RegisterNamespacesServer(srv, fakeNamespaces{})
		containersapi.RegisterContainersServer(srv, fakeContainers{s: st})
		tasksapi.RegisterTasksServer(srv, fakeTasks{s: st})
	})})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type fakeNamespaces struct {
	namespacesapi.UnimplementedNamespacesServer
}

func (fakeNamespaces) List(context.Context, *namespacesapi.ListNamespacesRequest) (*namespacesapi.ListNamespacesResponse, error) {
	return &namespacesapi.ListNamespacesResponse{Namespaces: []*namespacesapi.Namespace{{Name: "kc"}}}, nil
}

type fakeContainers struct {
	containersapi.UnimplementedContainersServer
	s *fakeState
}

func (f fakeContainers) List(_ context.Context, r *containersapi.ListContainersRequest) (*containersapi.ListContainersResponse, error) {
	return &containersapi.ListContainersResponse{Containers: f.listed(r)}, nil
}

func (f fakeContainers) ListStream(r *containersapi.ListContainersRequest, srv containersapi.Containers_ListStreamServer) error {
	if !f.s.stream {
		return status.Error(codes.Unimplemented, "method ListStream not implemented")
	}
	for _, c := range f.listed(r) {
		if err := srv.Send(&containersapi.ListContainerMessage{Container: c}); err != nil {
			return err
		}
	}
	return nil
}

func (f fakeContainers) listed(r *containersapi.ListContainersRequest) []*containersapi.Container {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	var out []*containersapi.Container
	for _, id := range f.s.containers {
		if len(r.GetFilters()) == 0 || slices.Contains(r.GetFilters(), "id=="+id) {
			out = append(out, &containersapi.Container{ID: id, Image: "busybox", Labels: f.s.labels})
		}
	}
	return out
}

type fakeTasks struct {
	tasksapi.UnimplementedTasksServer
	s *fakeState
}

func (f fakeTasks) process(id string) *tasktypes.Process {
	return &tasktypes.Process{ContainerID: id, ID: id, Pid: 4242, Status: f.s.tasks[id]}
}

func (f fakeTasks) Get(_ context.Context, r *tasksapi.GetRequest) (*tasksapi.GetResponse, error) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	id := r.GetContainerID()
	f.s.gets = append(f.s.gets, id)
	if c, ok := f.s.getErr[id]; ok {
		return nil, status.Error(c, "the shim did not answer")
	}
	// containerd looks the container record up first.
	if !slices.Contains(f.s.containers, id) {
		return nil, status.Errorf(codes.NotFound, "container %q in namespace: not found", id)
	}
	if _, ok := f.s.tasks[id]; !ok {
		return nil, status.Errorf(codes.NotFound, "task %s not found", id)
	}
	return &tasksapi.GetResponse{Process: f.process(id)}, nil
}

func (f fakeTasks) List(context.Context, *tasksapi.ListTasksRequest) (*tasksapi.ListTasksResponse, error) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.lists++
	if f.s.listErr != codes.OK {
		return nil, status.Error(f.s.listErr, "containerd is shutting down")
	}
	r := &tasksapi.ListTasksResponse{}
	for id := range f.s.tasks {
		r.Tasks = append(r.Tasks, f.process(id))
	}
	return r, nil
}

// TestListPastOneReplysCap: containers whose labels (CRI copies an
// image's into them) take the list past the receive cap in one reply
// are listed one message each, their pods still named; a containerd
// that does not serve the stream is asked List, whose reply past the
// cap fails the question (exit 3) rather than lose a container.
func TestListPastOneReplysCap(t *testing.T) {
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	big := map[string]string{"org.opencontainers.image.description": strings.Repeat("x", 25<<20),
		engine.LabelPodNamespace: "ns", engine.LabelPodName: "pod", engine.LabelContainer: "c"}
	for _, tc := range []struct {
		name   string
		stream bool
	}{
		{"streamed", true},
		{"one reply", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &fakeState{containers: []string{id('a'), id('b'), id('c')}, labels: big, stream: tc.stream,
				tasks: map[string]tasktypes.Status{id('a'): tasktypes.Status_RUNNING, id('b'): tasktypes.Status_RUNNING, id('c'): tasktypes.Status_RUNNING}}
			e := fakeContainerd(t, st)
			ans, err := e.Live(context.Background())
			if !tc.stream {
				if err == nil {
					t.Fatalf("Live = %d containers, nil; want the reply past the cap refused", len(ans.Containers))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ans.Containers) != 3 {
				t.Fatalf("%d containers, want 3", len(ans.Containers))
			}
			for _, c := range ans.Containers {
				if !c.Live || c.Pod != "ns/pod/c" {
					t.Errorf("container %+v: want live, of pod ns/pod/c", c)
				}
			}
		})
	}
}

// TestLiveOfWhenATaskCannotBeAskedAlone: a task Get that fails other than
// NotFound says nothing of the container; the whole list, containerd's own
// account, is the answer, and when that fails too the question fails. A
// Get that says NotFound is a container without a live task; an ID with
// no container record may still have one (List keeps a task whose
// record is gone): the whole list.
func TestLiveOfWhenATaskCannotBeAskedAlone(t *testing.T) {
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	a, b, c, orphan := id('a'), id('b'), id('c'), id('d')
	running := tasktypes.Status_RUNNING
	for _, tc := range []struct {
		name    string
		state   *fakeState
		ask     []string
		live    []string // the answer's live containers, sorted
		listed  int      // containers in the answer
		whole   bool
		fails   bool
		wantGet []string
	}{
		{name: "each task asked alone",
			state: &fakeState{containers: []string{a, b, c}, tasks: map[string]tasktypes.Status{a: running, c: running}},
			ask:   []string{a, b},
			live:  []string{a}, listed: 2, wantGet: []string{a, b}},
		{name: "a status containerd cannot tell is live",
			state: &fakeState{containers: []string{a}, tasks: map[string]tasktypes.Status{a: tasktypes.Status_UNKNOWN}},
			ask:   []string{a},
			live:  []string{a}, listed: 1, wantGet: []string{a}},
		{name: "a status the API does not name: the question fails",
			state: &fakeState{containers: []string{a}, tasks: map[string]tasktypes.Status{a: tasktypes.Status(9)}},
			ask:   []string{a},
			fails: true, wantGet: []string{a}},
		{name: "a task without its container record: the whole list, which keeps it live",
			state: &fakeState{containers: []string{a}, tasks: map[string]tasktypes.Status{a: running, orphan: running}},
			ask:   []string{a, orphan},
			live:  []string{a, orphan}, listed: 2, whole: true, wantGet: []string{a, orphan}},
		{name: "a container removed with its task: the whole list",
			state: &fakeState{containers: []string{a}, tasks: map[string]tasktypes.Status{a: running}},
			ask:   []string{a, orphan},
			live:  []string{a}, listed: 1, whole: true, wantGet: []string{a, orphan}},
		{name: "a Get that fails: the whole list",
			state: &fakeState{containers: []string{a, b, c}, tasks: map[string]tasktypes.Status{a: running, b: running, c: running},
				getErr: map[string]codes.Code{b: codes.Unavailable}},
			ask:  []string{a, b},
			live: []string{a, b, c}, listed: 3, whole: true, wantGet: []string{a, b}},
		{name: "a Get that times out: the whole list",
			state: &fakeState{containers: []string{a, b}, tasks: map[string]tasktypes.Status{a: running, b: running},
				getErr: map[string]codes.Code{a: codes.DeadlineExceeded}},
			ask:  []string{a, b},
			live: []string{a, b}, listed: 2, whole: true, wantGet: []string{a}},
		{name: "the whole list fails too",
			state: &fakeState{containers: []string{a, b}, tasks: map[string]tasktypes.Status{a: running, b: running},
				getErr: map[string]codes.Code{b: codes.Internal}, listErr: codes.Unavailable},
			ask:   []string{a, b},
			fails: true, wantGet: []string{a, b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.state
			e := fakeContainerd(t, st)
			ans, whole, err := e.(engine.Narrower).LiveOf(context.Background(), tc.ask)
			if tc.fails {
				if err == nil {
					t.Fatalf("LiveOf = %+v, nil; want an error: nothing can be known", ans)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var live []string
			for _, x := range ans.Containers {
				if x.Live {
					live = append(live, x.ID)
				}
			}
			slices.Sort(live)
			if whole != tc.whole || !slices.Equal(live, tc.live) || len(ans.Containers) != tc.listed {
				t.Errorf("LiveOf = whole %v, %d containers, live %v; want whole %v, %d, live %v",
					whole, len(ans.Containers), live, tc.whole, tc.listed, tc.live)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if !slices.Equal(st.gets, tc.wantGet) {
				t.Errorf("tasks asked alone: %v; want %v", st.gets, tc.wantGet)
			}
			if wantLists := map[bool]int{true: 1}[tc.whole]; st.lists != wantLists {
				t.Errorf("whole task lists: %d; want %d", st.lists, wantLists)
			}
		})
	}
}
