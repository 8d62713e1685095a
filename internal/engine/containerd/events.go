package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Topics containerd publishes when a task's init process exits and when
// the task is deleted (ctr task rm, CRI's container removal, shim exit).
const (
	TopicTaskExit   = "/tasks/exit"
	TopicTaskDelete = "/tasks/delete"
)

// Event is a container's task ending, as containerd reported it.
type Event struct {
	Namespace   string
	Topic       string
	ContainerID string
	PID         int
	ExitStatus  uint32
	At          time.Time
}

// Subscribe calls fn for every /tasks/exit and /tasks/delete of a
// container's init process in the given namespaces (nil: all) until ctx is
// done — then it returns nil — or the stream drops, which is an error the
// caller re-subscribes after. Exits of exec'd processes are not a
// container's death and are left out. ready, if not nil, is closed once
// the subscription was sent; containerd sends nothing back until the first
// event, so an event published at that very moment may still be missed
// (the janitor's periodic round is the backstop for that).
func (c *Client) Subscribe(ctx context.Context, namespaces []string, ready chan<- struct{}, fn func(Event)) error {
	want := map[string]bool{}
	for _, ns := range namespaces {
		want[ns] = true
	}
	stream, err := eventsapi.NewEventsClient(c.conn).Subscribe(ctx, &eventsapi.SubscribeRequest{
		Filters: []string{`topic=="` + TopicTaskExit + `"`, `topic=="` + TopicTaskDelete + `"`},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return c.wrap("subscribe to task events", err)
	}
	if ready != nil {
		close(ready)
	}
	for {
		env, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("containerd at %s closed the event stream", c.address)
			}
			return c.wrap("task events", err)
		}
		if len(want) > 0 && !want[env.GetNamespace()] {
			continue
		}
		ev, ok, err := decode(env.GetTopic(), env.GetEvent().GetValue())
		if err != nil {
			// One undecodable event is not a dropped stream: the periodic
			// round still covers that container.
			continue
		}
		if !ok {
			continue
		}
		ev.Namespace = env.GetNamespace()
		if ev.At.IsZero() && env.GetTimestamp() != nil {
			ev.At = env.GetTimestamp().AsTime()
		}
		fn(ev)
	}
}

// taskEnd is what /tasks/exit and /tasks/delete carry alike.
type taskEnd interface {
	proto.Message
	GetContainerID() string
	GetID() string
	GetPid() uint32
	GetExitStatus() uint32
	GetExitedAt() *timestamppb.Timestamp
}

// decode reads an event body by its topic. ok is false for an event that
// is not a container's init process ending.
func decode(topic string, body []byte) (ev Event, ok bool, err error) {
	var m taskEnd
	switch topic {
	case TopicTaskExit:
		m = &eventtypes.TaskExit{}
	case TopicTaskDelete:
		m = &eventtypes.TaskDelete{}
	default:
		return Event{}, false, nil
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return Event{}, false, fmt.Errorf("%s event: %w", topic, err)
	}
	// An exec'd process's end carries its own ID, not the container's.
	if m.GetContainerID() == "" || (m.GetID() != "" && m.GetID() != m.GetContainerID()) {
		return Event{}, false, nil
	}
	ev = Event{Topic: topic, ContainerID: m.GetContainerID(), PID: int(m.GetPid()), ExitStatus: m.GetExitStatus()}
	if m.GetExitedAt() != nil {
		ev.At = m.GetExitedAt().AsTime()
	}
	return ev, true, nil
}
