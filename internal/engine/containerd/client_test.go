package containerd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestResolveAddress(t *testing.T) {
	t.Setenv("CONTAINERD_ADDRESS", "")
	if got := ResolveAddress(""); got != DefaultAddress {
		t.Errorf("no flag, no env: %q", got)
	}
	t.Setenv("CONTAINERD_ADDRESS", "/x.sock")
	if got := ResolveAddress(""); got != "/x.sock" {
		t.Errorf("env: %q", got)
	}
	if got := ResolveAddress("/y.sock"); got != "/y.sock" {
		t.Errorf("flag wins: %q", got)
	}
}

func TestDecode(t *testing.T) {
	mustMarshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		topic  string
		body   []byte
		wantOK bool
		errs   bool
		wantID string
	}{
		{"init exit", TopicTaskExit, mustMarshal(&eventtypes.TaskExit{ContainerID: "c1", ID: "c1", Pid: 7}), true, false, "c1"},
		{"exec exit is no death", TopicTaskExit, mustMarshal(&eventtypes.TaskExit{ContainerID: "c1", ID: "exec-1", Pid: 8}), false, false, ""},
		{"init delete (empty exec id)", TopicTaskDelete, mustMarshal(&eventtypes.TaskDelete{ContainerID: "c2", Pid: 9}), true, false, "c2"},
		{"exec delete", TopicTaskDelete, mustMarshal(&eventtypes.TaskDelete{ContainerID: "c2", ID: "e"}), false, false, ""},
		{"no container", TopicTaskExit, mustMarshal(&eventtypes.TaskExit{}), false, false, ""},
		{"garbage", TopicTaskExit, []byte{0xff, 0xff, 0xff}, false, true, ""},
		{"other topic", "/tasks/start", nil, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, ok, err := decode(tc.topic, tc.body)
			if (err != nil) != tc.errs || ok != tc.wantOK || ev.ContainerID != tc.wantID {
				t.Fatalf("decode = %+v, %v, %v; want ok=%v err=%v id=%q", ev, ok, err, tc.wantOK, tc.errs, tc.wantID)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		setup func() string
	}{
		{"no socket", func() string { return filepath.Join(dir, "absent.sock") }},
		{"hung daemon", func() string {
			// Accepts connections and never speaks: the HTTP/2 handshake
			// never completes.
			p := filepath.Join(dir, "hung.sock")
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					t.Cleanup(func() { c.Close() })
				}
			}()
			return p
		}},
		{"garbage speaker", func() string {
			p := filepath.Join(dir, "garbage.sock")
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Write([]byte("HTTP/1.1 200 OK\r\n\r\nnot grpc at all"))
					c.Close()
				}
			}()
			return p
		}},
		{"symlink", func() string {
			p := filepath.Join(dir, "link.sock")
			if err := os.Symlink(filepath.Join(dir, "hung.sock"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(tc.setup())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			cs, err := c.List(ctx, nil)
			if err == nil {
				t.Fatalf("List = %v, nil; want an error", cs)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("List took %v with a 1s deadline", took)
			}
			if !strings.Contains(err.Error(), "containerd at ") {
				t.Errorf("error does not name the daemon: %v", err)
			}
			t.Logf("error: %v", err)
		})
	}
}

// TestLive runs containers in two namespaces of the private containerd and
// checks List's view of them, then that a task exit and delete arrive as
// events.
func TestLive(t *testing.T) {
	addr := containerdtest.Address(t)
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	running, other, stopped := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), "ctr-name-"+testutil.RandomHex(t, 64)[:8]
	pid := containerdtest.Run(t, addr, "kc-test-a", running, nil, "/bin/sleep", "600")
	otherPID := containerdtest.Run(t, addr, "kc-test-b", other, nil, "/bin/sleep", "600")
	containerdtest.Run(t, addr, "kc-test-a", stopped, nil, "/bin/sleep", "600")
	containerdtest.Kill(t, addr, "kc-test-a", stopped)

	if _, err := c.Version(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.PeerUID(); got != os.Geteuid() {
		t.Errorf("PeerUID = %d; want %d (containerd runs as this test's user)", got, os.Geteuid())
	}

	find := func(cs []Container, id string) (Container, bool) {
		for _, x := range cs {
			if x.ID == id {
				return x, true
			}
		}
		return Container{}, false
	}
	t.Run("every namespace", func(t *testing.T) {
		cs, err := c.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			id, ns, status string
			live           bool
			pid            int
		}{
			{running, "kc-test-a", "running", true, pid},
			{other, "kc-test-b", "running", true, otherPID},
			{stopped, "kc-test-a", "stopped", false, 0},
		} {
			got, ok := find(cs, w.id)
			if !ok {
				t.Errorf("%s missing from List", w.id)
				continue
			}
			if got.Namespace != w.ns || got.Status != w.status || got.Live != w.live || got.PID != w.pid || got.Image != containerdtest.ImageName {
				t.Errorf("%s = %+v; want ns %s status %s live %v pid %d", w.id, got, w.ns, w.status, w.live, w.pid)
			}
		}
	})
	t.Run("one namespace", func(t *testing.T) {
		cs, err := c.List(ctx, []string{"kc-test-b"})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := find(cs, running); ok {
			t.Errorf("namespace kc-test-b lists kc-test-a's %s", running)
		}
		if _, ok := find(cs, other); !ok {
			t.Errorf("namespace kc-test-b misses %s", other)
		}
	})
	t.Run("unknown namespace", func(t *testing.T) {
		cs, err := c.List(ctx, []string{"kc-test-a", "no-such-namespace"})
		if !errors.Is(err, ErrNoNamespace) || cs != nil {
			t.Fatalf("List = %v, %v; want ErrNoNamespace and no list", cs, err)
		}
	})
	t.Run("no task", func(t *testing.T) {
		id := testutil.RandomHex(t, 64)
		containerdtest.ImportImage(t, addr, "kc-test-a")
		containerdtest.Ctr(t, addr, "kc-test-a", "containers", "create", containerdtest.ImageName, id, "/bin/true")
		t.Cleanup(func() { containerdtest.Remove(addr, "kc-test-a", id) })
		cs, err := c.List(ctx, []string{"kc-test-a"})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := find(cs, id); !ok || got.Live || got.Status != NoTask {
			t.Errorf("container without a task = %+v, %v; want listed, not live, %q", got, ok, NoTask)
		}
	})
	// ListOf is List for the containers it names: the same entries, no
	// other, whatever their task (running, stopped, none). An ID with no
	// container record is ErrTaskUnread: a task can outlive its record,
	// and only the whole list shows it.
	t.Run("about some", func(t *testing.T) {
		notask := testutil.RandomHex(t, 64)
		containerdtest.Ctr(t, addr, "kc-test-a", "containers", "create", containerdtest.ImageName, notask, "/bin/true")
		t.Cleanup(func() { containerdtest.Remove(addr, "kc-test-a", notask) })
		ids := []string{running, other, stopped, notask}
		whole, err := c.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var want []Container
		for _, x := range whole {
			if slices.Contains(ids, x.ID) {
				want = append(want, x)
			}
		}
		some, err := c.ListOf(ctx, nil, ids)
		if err != nil {
			t.Fatal(err)
		}
		less := func(a, b Container) int { return strings.Compare(a.ID, b.ID) }
		slices.SortFunc(want, less)
		slices.SortFunc(some, less)
		if none, err := c.ListOf(ctx, nil, append(ids, testutil.RandomHex(t, 64))); !errors.Is(err, ErrTaskUnread) {
			t.Errorf("ListOf with an unknown container: %+v, %v; want ErrTaskUnread", none, err)
		}
		if len(want) != 4 || !slices.EqualFunc(some, want, func(a, b Container) bool {
			return a.Namespace == b.Namespace && a.ID == b.ID && a.Status == b.Status && a.Live == b.Live && a.PID == b.PID && a.Image == b.Image
		}) {
			t.Errorf("ListOf = %+v;\nList has %+v", some, want)
		}
	})
	t.Run("events", func(t *testing.T) {
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		ready := make(chan struct{})
		evs := make(chan Event, 16)
		done := make(chan error, 1)
		go func() { done <- c.Subscribe(sctx, []string{"kc-test-b"}, ready, func(e Event) { evs <- e }) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Subscribe: %v", err)
		}
		// Until containerd has registered the subscriber, events are not
		// forwarded to it: publish a probe exit until one comes back.
		probe := "probe-" + testutil.RandomHex(t, 64)[:8]
		waitProbe := func() bool {
			publishExit(t, c, "kc-test-b", probe)
			select {
			case e := <-evs:
				if e.ContainerID != probe {
					t.Fatalf("event %+v before any container died", e)
				}
				return true
			case <-time.After(100 * time.Millisecond):
				return false
			}
		}
		for i := 0; !waitProbe(); i++ {
			if i > 100 {
				t.Fatal("the subscription never saw a probe event")
			}
		}
		// Probes published before the one that came back may still be on
		// their way: they are skipped below.
		// A death in a namespace not asked for must not arrive.
		containerdtest.Kill(t, addr, "kc-test-a", running)
		containerdtest.Kill(t, addr, "kc-test-b", other)
		containerdtest.Ctr(t, addr, "kc-test-b", "tasks", "rm", other)
		want := []string{TopicTaskExit, TopicTaskDelete}
		for len(want) > 0 {
			select {
			case e := <-evs:
				if e.ContainerID == probe && e.Namespace == "kc-test-b" {
					continue
				}
				if e.ContainerID != other || e.Namespace != "kc-test-b" {
					t.Fatalf("event %+v; want only %s's in kc-test-b", e, other)
				}
				if e.Topic != want[0] {
					t.Fatalf("event %s; want %s", e.Topic, want[0])
				}
				if e.PID != otherPID {
					t.Errorf("event PID %d; want %d", e.PID, otherPID)
				}
				want = want[1:]
			case <-time.After(30 * time.Second):
				t.Fatalf("no %v event within 30s", want)
			}
		}
		scancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe after cancel: %v", err)
		}
	})
}

// publishExit publishes a /tasks/exit for id in ns through containerd's
// events service, as a shim would.
func publishExit(t *testing.T, c *Client, ns, id string) {
	t.Helper()
	body, err := proto.Marshal(&eventtypes.TaskExit{ContainerID: id, ID: id, Pid: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(withNamespace(context.Background(), ns), 10*time.Second)
	defer cancel()
	_, err = eventsapi.NewEventsClient(c.conn).Publish(ctx, &eventsapi.PublishRequest{
		Topic: TopicTaskExit,
		Event: &anypb.Any{TypeUrl: "containerd.events.TaskExit", Value: body},
	})
	if err != nil {
		t.Fatalf("publishing a probe event: %v", err)
	}
}
