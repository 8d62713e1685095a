package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	namespacesapi "github.com/containerd/containerd/api/services/namespaces/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// ErrNoNamespace means a namespace the caller named does not exist in this
// containerd. It is not "no containers": a misspelt namespace would
// otherwise hide every container of the real one and make their trees
// look stray.
var ErrNoNamespace = errors.New("containerd namespace does not exist")

// Container is one containerd container and its task.
type Container struct {
	Namespace string
	ID        string
	Image     string
	// Status is the task's status in containerd's words ("running",
	// "stopped", ...), or "no task" when the container has none.
	Status string
	// Live says the container's processes may run: its task is created,
	// running, paused or pausing, or exists with a status containerd could
	// not tell (an unanswering shim is no proof of death).
	Live bool
	// PID is the task's init PID on the host (0 without a live task).
	PID int
	// Labels are the container's (the kubelet's name its pod).
	Labels map[string]string
}

// NoTask is Container.Status for a container without a task.
const NoTask = "no task"

// IsLiveStatus reports whether a task in status s counts as alive.
func IsLiveStatus(s tasktypes.Status) bool {
	switch s {
	case tasktypes.Status_CREATED, tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING, tasktypes.Status_UNKNOWN:
		return true
	}
	return false
}

// statusName is containerd's lower-case word for a task status, as ctr
// prints it.
func statusName(s tasktypes.Status) string {
	switch s {
	case tasktypes.Status_CREATED:
		return "created"
	case tasktypes.Status_RUNNING:
		return "running"
	case tasktypes.Status_STOPPED:
		return "stopped"
	case tasktypes.Status_PAUSED:
		return "paused"
	case tasktypes.Status_PAUSING:
		return "pausing"
	}
	return "unknown"
}

// Namespaces lists containerd's namespaces, sorted.
func (c *Client) Namespaces(ctx context.Context) ([]string, error) {
	r, err := namespacesapi.NewNamespacesClient(c.conn).List(ctx, &namespacesapi.ListNamespacesRequest{})
	if err != nil {
		return nil, c.wrap("list namespaces", err)
	}
	var out []string
	for _, ns := range r.GetNamespaces() {
		out = append(out, ns.GetName())
	}
	sort.Strings(out)
	return out, nil
}

// List returns every container of the given namespaces with its task's
// status and PID; nil or empty namespaces means every namespace. Any
// failure — a namespace that does not exist, a list that could not be
// read — is an error and no partial list: callers take the answer as
// ground truth.
func (c *Client) List(ctx context.Context, namespaces []string) ([]Container, error) {
	return c.list(ctx, namespaces, nil)
}

// ErrTaskUnread is ListOf's error when a task could not be asked alone:
// the whole list, containerd's own account of such a task (unknown, or
// left out when its shim is gone), is the answer to take.
var ErrTaskUnread = errors.New("a task's state could not be read")

// ListOf is List about the containers ids name alone: those the list
// filtered to them holds, and their tasks (one Get per ID), not every
// task, which costs a question to each one's shim. containerd answers a
// Get by the container record, and a task can outlive it (List keeps
// such a task, live): an ID no namespace holds a record of is
// ErrTaskUnread, and the whole list is the answer to take.
func (c *Client) ListOf(ctx context.Context, namespaces, ids []string) ([]Container, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return c.list(ctx, namespaces, ids)
}

func (c *Client) list(ctx context.Context, namespaces, only []string) ([]Container, error) {
	all, err := c.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	want := all
	if len(namespaces) > 0 {
		want = nil
		for _, ns := range namespaces {
			if !slices.Contains(all, ns) {
				return nil, fmt.Errorf("%w: %q (containerd at %s has %v)", ErrNoNamespace, ns, c.address, all)
			}
			if !slices.Contains(want, ns) {
				want = append(want, ns)
			}
		}
	}
	var out []Container
	for _, ns := range want {
		cs, err := c.listNamespace(ctx, ns, only)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	for _, id := range only {
		if !slices.ContainsFunc(out, func(x Container) bool { return x.ID == id }) {
			return nil, fmt.Errorf("%w: container %s has no record in containerd at %s (a task of it shows in the whole list only)", ErrTaskUnread, id, c.address)
		}
	}
	return out, nil
}

// listNamespace joins one namespace's containers with its tasks, or
// only's (nil: all). Tasks are asked after containers, so a container
// created in between has no task here (not live) — and a task can only
// exist for a listed container unless one was created in between, which
// is kept as live all the same.
func (c *Client) listNamespace(ctx context.Context, ns string, only []string) ([]Container, error) {
	nctx := withNamespace(ctx, ns)
	req := &containersapi.ListContainersRequest{}
	for _, id := range only {
		// Filters are or'ed; an ID is hex, nothing to quote.
		req.Filters = append(req.Filters, "id=="+id)
	}
	cs, err := c.containers(nctx, req)
	if err != nil {
		return nil, c.wrap("list containers in namespace "+ns, err)
	}
	var ts []*tasktypes.Process
	if only == nil {
		tr, err := tasksapi.NewTasksClient(c.conn).List(nctx, &tasksapi.ListTasksRequest{})
		if err != nil {
			return nil, c.wrap("list tasks in namespace "+ns, err)
		}
		ts = tr.GetTasks()
	}
	for _, id := range only {
		tr, err := tasksapi.NewTasksClient(c.conn).Get(nctx, &tasksapi.GetRequest{ContainerID: id})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTaskUnread, c.wrap("get the task of "+id+" in namespace "+ns, err))
		}
		ts = append(ts, tr.GetProcess())
	}
	tasks := map[string]*tasktypes.Process{}
	for _, t := range ts {
		// Exec processes share their container's ID; the init process's
		// own ID is the container's.
		if id := t.GetContainerID(); id == "" {
			tasks[t.GetID()] = t
		} else if t.GetID() == id || tasks[id] == nil {
			tasks[id] = t
		}
	}
	out := make([]Container, 0, len(cs))
	seen := map[string]bool{}
	for _, ct := range cs {
		id := ct.GetID()
		if id == "" || seen[id] {
			return nil, fmt.Errorf("containerd at %s: namespace %s lists a container with an empty or repeated ID %q", c.address, ns, id)
		}
		seen[id] = true
		x, err := fromTask(ns, id, ct.GetImage(), tasks[id])
		if err != nil {
			return nil, fmt.Errorf("containerd at %s: %w", c.address, err)
		}
		x.Labels = ct.GetLabels()
		out = append(out, x)
	}
	for id, t := range tasks {
		if !seen[id] {
			x, err := fromTask(ns, id, "", t)
			if err != nil {
				return nil, fmt.Errorf("containerd at %s: %w", c.address, err)
			}
			out = append(out, x)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// containers lists the containers req asks for, one message each
// (ListStream), each kept with what is read of it: its ID, its image and
// the labels that name its pod. CRI copies an image's labels into its
// containers' (with no bound), and in List's one reply a pod author's
// could take the whole list past the receive cap: every question would
// fail. A containerd that does not serve the stream is asked List.
func (c *Client) containers(ctx context.Context, req *containersapi.ListContainersRequest) ([]*containersapi.Container, error) {
	api := containersapi.NewContainersClient(c.conn)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := api.ListStream(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*containersapi.Container
	for {
		m, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return out, nil
		case status.Code(err) == codes.Unimplemented && len(out) == 0:
			r, err := api.List(ctx, req)
			if err != nil {
				return nil, err
			}
			for _, ct := range r.GetContainers() {
				out = append(out, kept(ct))
			}
			return out, nil
		case err != nil:
			return nil, err
		}
		out = append(out, kept(m.GetContainer()))
	}
}

// kept is what is read of ct: the rest (its spec, its other labels) is
// not held for the whole list.
func kept(ct *containersapi.Container) *containersapi.Container {
	k := &containersapi.Container{ID: ct.GetID(), Image: ct.GetImage()}
	for _, l := range []string{engine.LabelPodNamespace, engine.LabelPodName, engine.LabelContainer} {
		if v, ok := ct.GetLabels()[l]; ok {
			if k.Labels == nil {
				k.Labels = map[string]string{}
			}
			k.Labels[l] = v
		}
	}
	return k
}

// fromTask is container id of namespace ns with its task t (nil: none).
// A task status containerd's API does not name (a newer server's) is an
// error: read as "not live", its container's trees would be strays
// (DESIGN "Engines": a state the engine never reports makes the truth
// unknown).
func fromTask(ns, id, image string, t *tasktypes.Process) (Container, error) {
	c := Container{Namespace: ns, ID: id, Image: image, Status: NoTask}
	if t == nil {
		return c, nil
	}
	if _, ok := tasktypes.Status_name[int32(t.GetStatus())]; !ok {
		return c, fmt.Errorf("namespace %s: container %s has a task in status %d, which this containerd API does not name", ns, id, t.GetStatus())
	}
	c.Status = statusName(t.GetStatus())
	c.Live = IsLiveStatus(t.GetStatus())
	if c.Live {
		c.PID = int(t.GetPid())
	}
	return c, nil
}
