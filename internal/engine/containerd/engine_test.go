package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

func TestContainerdSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr string
		ns   []string
		bad  bool
	}{
		{name: "defaults"},
		{name: "unix URL", addr: "unix:///run/containerd/containerd.sock", ns: []string{"k8s.io", "moby", "default"}},
		{name: "relative", addr: "containerd.sock", bad: true},
		{name: "tcp", addr: "tcp://127.0.0.1:1", bad: true},
		{name: "bad namespace", ns: []string{"k8s io"}, bad: true},
		{name: "namespace with a slash", ns: []string{"../x"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSettings(tc.addr, tc.ns)
			if tc.bad != (err != nil) || (err != nil && !errors.Is(err, engine.ErrUsage)) {
				t.Fatalf("CheckSettings(%q, %q) = %v; want bad=%v (a usage error)", tc.addr, tc.ns, err, tc.bad)
			}
		})
	}
}

// TestContainerdEngine: Live, Resolve (full ID, unique prefix, ambiguous
// prefix, a ctr name) and Deaths against the private containerd.
func TestContainerdEngine(t *testing.T) {
	addr := containerdtest.Address(t)
	hexID := func(prefix string) string {
		b := make([]byte, 32)
		rand.Read(b)
		return prefix + hex.EncodeToString(b)[:64-len(prefix)]
	}
	// A prefix of this run's own: other tests' random IDs must not match it.
	prefix := hexID("")[:9]
	a1, a2 := hexID(prefix), hexID(prefix)
	pid1 := containerdtest.Run(t, addr, "kc-eng-a", a1, nil, "/bin/sleep", "600")
	containerdtest.Run(t, addr, "kc-eng-b", a2, nil, "/bin/sleep", "600")
	name := "kc-named-" + hexID("")[:6]
	namedPID := containerdtest.Run(t, addr, "kc-eng-a", name, nil, "/bin/sleep", "600")

	e, err := New(engine.Config{ContainerdAddress: addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a, err := e.Live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]int{}
	for _, c := range a.Containers {
		if c.Live {
			live[c.ID] = c.InitPID
		}
		if c.ID == name {
			t.Errorf("Live lists the non-hex ID %q", name)
		}
	}
	if live[a1] != pid1 || live[a2] == 0 || a.UID < 0 {
		t.Errorf("Live: %v (uid %d); want %s with PID %d and %s, both namespaces", live, a.UID, a1, pid1, a2)
	}

	// Asked about some containers: those of them containerd knows, each
	// with its task as the whole list has it, and no other; with one it
	// has no record of (whose task only the whole list would show), the
	// whole list.
	t.Run("about some", func(t *testing.T) {
		some, whole, err := e.(engine.Narrower).LiveOf(ctx, []string{a1})
		if err != nil || whole {
			t.Fatalf("LiveOf: whole %v, %v", whole, err)
		}
		if len(some.Containers) != 1 || some.Containers[0].ID != a1 || !some.Containers[0].Live || some.Containers[0].InitPID != pid1 ||
			some.UID != a.UID || some.Endpoint != a.Endpoint || some.Source != a.Source {
			t.Errorf("asked about %s: %+v; want it alone, live with PID %d", a1[:12], some, pid1)
		}
		all, whole, err := e.(engine.Narrower).LiveOf(ctx, []string{a1, hexID(prefix)})
		if err != nil || !whole || !slices.ContainsFunc(all.Containers, func(c engine.Container) bool { return c.ID == a1 && c.Live }) {
			t.Errorf("asked about %s and an unknown one: whole %v, %+v, %v; want the whole list, %s live", a1[:12], whole, all, err, a1[:12])
		}
	})

	for _, tc := range []struct {
		ref  string
		want []string
	}{
		{a1, []string{a1}},
		{a1[:12], []string{a1}},
		{prefix, []string{a1, a2}},
		{name, []string{name}},
		{"ffffffffffff", nil},
	} {
		t.Run("resolve "+tc.ref[:min(12, len(tc.ref))], func(t *testing.T) {
			ms, err := e.Resolve(ctx, tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != len(tc.want) {
				t.Fatalf("Resolve(%q) = %+v; want %v", tc.ref, ms, tc.want)
			}
			for _, m := range ms {
				if m.InitPID == 0 {
					t.Errorf("match %s without an init PID", m.ID)
				}
				if m.ID == name && m.InitPID != namedPID {
					t.Errorf("named container PID %d; want %d", m.InitPID, namedPID)
				}
			}
		})
	}

	t.Run("deaths", func(t *testing.T) {
		dctx, dcancel := context.WithCancel(ctx)
		defer dcancel()
		deaths := make(chan engine.Death, 8)
		done := make(chan error, 1)
		ready := make(chan struct{})
		go func() {
			done <- e.Deaths(dctx, engine.DeathWatch{Ready: func() { close(ready) }, Death: func(d engine.Death) { deaths <- d }})
		}()
		// The task is killed once containerd has the subscription.
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Deaths returned %v before subscribing", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no subscription within 30s")
		}
		containerdtest.Kill(t, addr, "kc-eng-b", a2)
		containerdtest.Ctr(t, addr, "kc-eng-b", "tasks", "rm", a2)
		select {
		case d := <-deaths:
			if d.ID != a2 || d.Engine != "containerd" {
				t.Fatalf("death %+v; want %s", d, a2)
			}
		case err := <-done:
			t.Fatalf("Deaths returned %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no death event within 30s of the kill")
		}
	})
}

// TestContainerdSocketsOfKubernetesDistributions: auto asks the first
// containerd socket that exists, upstream's before k3s's and microk8s's.
func TestContainerdSocketsOfKubernetesDistributions(t *testing.T) {
	for _, want := range []string{"/run/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock", "/var/snap/microk8s/common/run/containerd.sock"} {
		if !slices.Contains(KnownSockets, want) {
			t.Errorf("auto does not look at %s", want)
		}
	}
	dir := t.TempDir()
	missing, k3s, other := filepath.Join(dir, "missing.sock"), filepath.Join(dir, "k3s.sock"), filepath.Join(dir, "other.sock")
	for _, p := range []string{k3s, other} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name  string
		paths []string
		want  string
		found bool
	}{
		{"none exists", []string{missing}, "", false},
		{"the first that exists", []string{missing, k3s, other}, k3s, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, ok := engine.FirstExisting(tt.paths); got != tt.want || ok != tt.found {
				t.Errorf("FirstExisting = %q, %v; want %q, %v", got, ok, tt.want, tt.found)
			}
		})
	}
}

// TestAutoKeepsWhereItFoundContainerd: across one watch's questions,
// auto asks containerd where it found it first; a socket of another
// containerd that appeared since (the first restarting) is not asked in
// its place, whose answer would call the first's containers gone.
func TestAutoKeepsWhereItFoundContainerd(t *testing.T) {
	t.Setenv("CONTAINERD_ADDRESS", "")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	saved := KnownSockets
	KnownSockets = []string{a, b}
	t.Cleanup(func() { KnownSockets = saved })
	cfg := engine.Config{Found: engine.NewFound()}
	endpoint := func() string {
		t.Helper()
		es, err := engine.Select(nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if e.Name() == "containerd" {
				return e.Endpoint()
			}
		}
		return ""
	}
	if err := os.WriteFile(a, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := endpoint(); got != a {
		t.Fatalf("first: containerd at %q, want %q", got, a)
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := endpoint(); got != a {
		t.Errorf("with only another's socket now: containerd at %q, want %q, where it was found", got, a)
	}
}
