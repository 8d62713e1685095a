package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const (
	idA = "aaaaaaaaaaaa0000000000000000000000000000000000000000000000000001"
	idB = "bbbbbbbbbbbb0000000000000000000000000000000000000000000000000002"
	idC = "aaaaaaaaaaaa0000000000000000000000000000000000000000000000000003"
)

// fake is an engine with a canned answer.
type fake struct {
	name string
	a    Answer
	err  error
}

func (f *fake) Name() string     { return f.name }
func (f *fake) Endpoint() string { return "fake://" + f.name }
func (f *fake) Live(context.Context) (Answer, error) {
	f.a.Engine = f.name
	return f.a, f.err
}
func (f *fake) Resolve(_ context.Context, ref string) ([]Match, error) {
	if f.err != nil {
		return nil, f.err
	}
	return MatchRef(f.name, f.a.Containers, ref), nil
}
func (f *fake) Deaths(context.Context, DeathWatch) error { return ErrNoEvents }

func TestParseNames(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"", nil, false},
		{"auto", nil, false},
		{"docker", []string{"docker"}, false},
		{"podman, Docker,podman", []string{"podman", "docker"}, false},
		{"containerd", []string{"containerd"}, false},
		{"auto,docker", nil, true},
		{"dokcer", nil, true},
		{"lxc", nil, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseNames(tc.in)
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Fatalf("ParseNames(%q) = %v, %v", tc.in, got, err)
			}
			if err != nil && !errors.Is(err, ErrUsage) {
				t.Fatalf("error %v is not a usage error", err)
			}
		})
	}
}

func TestAskUnion(t *testing.T) {
	pod := &fake{name: "podman", a: Answer{Source: SourceAPI, UID: 0, Containers: []Container{
		{ID: idA, State: "exited"},
	}}}
	dock := &fake{name: "docker", a: Answer{Source: SourceAPI, UID: 1000, Containers: []Container{
		{ID: idA, State: "running", Live: true, InitPID: 42, Names: []string{"web"}},
		{ID: idB, State: "exited"},
	}}}
	tr, err := Ask(t.Context(), []Engine{pod, dock})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.Set
	if !s.IsLive(idA) || s.IsLive(idB) || s.States[idA] != "running" {
		t.Fatalf("union %+v: a container live in any engine must be live", s)
	}
	if !s.Vouches(0) || !s.Vouches(1000) || s.Vouches(1) || s.Vouches(-1) {
		t.Fatalf("union vouches for %v, want 0 and 1000", s.UIDs)
	}
	if s.Source != SourceAPI || len(tr.Statuses) != 2 || tr.Statuses[1].Live != 1 || tr.Statuses[1].Containers != 2 {
		t.Fatalf("statuses %+v", tr.Statuses)
	}
}

// TestUnionInitPIDs: a container's init PID is taken from an answer of
// the one UID listing it, or from root's; a user's engine naming a
// process of his own as the init of a container root's engine lists too
// is not believed (its death would call root's container gone), nor are
// two different inits.
func TestUnionInitPIDs(t *testing.T) {
	a := func(uid int, cs ...Container) Answer { return Answer{UID: uid, Containers: cs} }
	c := func(pid int) Container { return Container{ID: idA, State: "running", Live: true, InitPID: pid} }
	for _, tc := range []struct {
		name    string
		answers []Answer
		want    int
	}{
		{"one engine", []Answer{a(0, c(42))}, 42},
		{"a user's engine alone", []Answer{a(1000, c(42))}, 42},
		{"root's, without a PID, and containerd's", []Answer{a(0, c(0)), a(0, c(42))}, 42},
		{"root's without a PID and a user's naming one", []Answer{a(0, c(0)), a(1000, c(42))}, 0},
		{"a user's naming one before root's without", []Answer{a(1000, c(42)), a(0, c(0))}, 0},
		{"root's naming one and a user's naming another", []Answer{a(1000, c(43)), a(0, c(42))}, 42},
		{"an unknown UID's and root's", []Answer{a(UIDUnknown, c(43)), a(0, c(0))}, 0},
		{"two inits of one UID", []Answer{a(0, c(42)), a(0, c(43))}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Union(tc.answers)
			if got := s.PIDs[idA]; got != tc.want || !s.IsLive(idA) {
				t.Errorf("PID %d (live %v), want %d (live)", got, s.IsLive(idA), tc.want)
			}
		})
	}
}

// TestListedFor: a container counts as listed (an exited one: its
// evidence of running then judged as such) only by an answer that is
// ground truth for the tree's UID; a user's engine listing a container
// of root's by its ID does not make it known to root.
func TestListedFor(t *testing.T) {
	s := Union([]Answer{
		{UID: 0, Containers: []Container{{ID: idB, State: "exited"}}},
		{UID: 1000, Containers: []Container{{ID: idA, State: "exited"}}},
	})
	for _, tc := range []struct {
		id   string
		uid  int
		want bool
	}{{idA, 0, false}, {idA, 1000, true}, {idB, 0, true}, {idB, 1000, false}, {idC, 0, false}, {idA, UIDUnknown, false}} {
		if got := s.ListedFor(tc.id, tc.uid); got != tc.want {
			t.Errorf("ListedFor(%.4s, %d) = %v, want %v", tc.id, tc.uid, got, tc.want)
		}
	}
	// A Set of one answer: what it lists.
	one := Set{States: map[string]string{idA: "exited"}}
	if !one.ListedFor(idA, 0) || one.ListedFor(idB, 0) {
		t.Error("a Set of one answer: listed is what it lists")
	}
}

func TestAskAnyFailureIsUnknown(t *testing.T) {
	ok := &fake{name: "podman", a: Answer{UID: 0}}
	bad := &fake{name: "docker", err: errors.New("connection refused")}
	tr, err := Ask(t.Context(), []Engine{ok, bad})
	if !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "docker: connection refused") {
		t.Fatalf("err = %v, want ground truth unknown naming docker", err)
	}
	if len(tr.Statuses) != 2 || tr.Statuses[1].Error == nil || tr.Statuses[0].Error != nil {
		t.Fatalf("statuses %+v", tr.Statuses)
	}
	if tr.Set.Live != nil {
		t.Fatal("a failed Ask must not give a live set")
	}
	// An engine's own error says "ground truth unknown" already (podman's
	// does); the union says it once, and what the engine failed on stays
	// reachable.
	cause := errors.New("no such file or directory")
	said := &fake{name: "podman", err: fmt.Errorf("%w: %w", ErrUnknown, cause)}
	tr, err = Ask(t.Context(), []Engine{said})
	if got, want := err.Error(), "ground truth unknown: podman: no such file or directory"; got != want || !errors.Is(err, cause) {
		t.Errorf("err = %q (wraps the cause: %v), want %q", got, errors.Is(err, cause), want)
	}
	if st := tr.Statuses[0]; st.Error == nil || *st.Error != cause.Error() {
		t.Errorf("status error %v, want %q", st.Error, cause)
	}
	if _, err := Ask(t.Context(), nil); !errors.Is(err, ErrUnknown) {
		t.Fatalf("no engine: err = %v, want unknown", err)
	}
}

func TestResolveOne(t *testing.T) {
	pod := &fake{name: "podman", a: Answer{Containers: []Container{{ID: idA, Names: []string{"positron-server"}, State: "running", Live: true, InitPID: 7}}}}
	dock := &fake{name: "docker", a: Answer{Containers: []Container{{ID: idB, Names: []string{"other"}, State: "running", Live: true, InitPID: 8}, {ID: idC, Names: []string{"third"}}}}}
	es := []Engine{pod, dock}
	for _, tc := range []struct {
		ref     string
		want    string
		wantErr error
	}{
		{"positron-server", idA, nil},
		{"bbbbbbbbbbbb", idB, nil},
		{idC, idC, nil},
		{"aaaaaaaaaaaa", "", ErrAmbiguous},
		{"nothing", "", ErrNoMatch},
		{"", "", ErrUsage},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			m, err := ResolveOne(t.Context(), es, tc.ref)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !errors.Is(err, ErrUsage) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || m.ID != tc.want {
				t.Fatalf("got %+v, %v; want %s", m, err, tc.want)
			}
		})
	}
	t.Run("ambiguous names the candidates", func(t *testing.T) {
		_, err := ResolveOne(t.Context(), es, "aaaa")
		if err == nil || !strings.Contains(err.Error(), "podman aaaaaaaaaaaa (positron-server)") || !strings.Contains(err.Error(), "docker aaaaaaaaaaaa (third)") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("one container two engines know is one match", func(t *testing.T) {
		// dockerd's containers are containerd's too, in namespace moby.
		moby := &fake{name: "containerd", a: Answer{Containers: []Container{{ID: idB, State: "running", Live: true, InitPID: 8}}}}
		for _, ref := range []string{"bbbbbbbbbbbb", idB, "other"} {
			m, err := ResolveOne(t.Context(), []Engine{pod, dock, moby}, ref)
			if err != nil || m.ID != idB || m.Engine != "docker" || m.InitPID != 8 {
				t.Errorf("%s: got %+v, %v; want docker's %s", ref, m, err, idB)
			}
		}
	})
	t.Run("one ID twice in one engine, or with two inits, is two containers", func(t *testing.T) {
		twoNS := &fake{name: "containerd", a: Answer{Containers: []Container{{ID: idB, Live: true, InitPID: 8}, {ID: idB, Live: true, InitPID: 9}}}}
		if m, err := ResolveOne(t.Context(), []Engine{twoNS}, idB); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("one ID in two namespaces: got %+v, %v; want ambiguous", m, err)
		}
		other := &fake{name: "containerd", a: Answer{Containers: []Container{{ID: idB, Live: true, InitPID: 9}}}}
		if m, err := ResolveOne(t.Context(), []Engine{dock, other}, idB); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("two engines, two inits: got %+v, %v; want ambiguous", m, err)
		}
		// idC is stopped in docker: a running container of its ID
		// elsewhere is another one, its init not docker's container's.
		running := &fake{name: "containerd", a: Answer{Containers: []Container{{ID: idC, Live: true, InitPID: 9}}}}
		if m, err := ResolveOne(t.Context(), []Engine{dock, running}, idC); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("a stopped container and a running one of its ID: got %+v, %v; want ambiguous", m, err)
		}
	})
	t.Run("an engine that cannot be asked makes no-match unknown", func(t *testing.T) {
		_, err := ResolveOne(t.Context(), []Engine{pod, &fake{name: "docker", err: errors.New("down")}}, "other")
		if !errors.Is(err, ErrUnknown) {
			t.Fatalf("err = %v, want unknown", err)
		}
	})
	t.Run("an engine that cannot be asked makes a lone name match unknown", func(t *testing.T) {
		down := &fake{name: "docker", err: errors.New("down")}
		if m, err := ResolveOne(t.Context(), []Engine{pod, down}, "positron-server"); !errors.Is(err, ErrUnknown) {
			t.Errorf("got %+v, %v; want unknown: docker may run another positron-server", m, err)
		}
		if m, err := ResolveOne(t.Context(), []Engine{pod, down}, idA); err != nil || m.ID != idA {
			t.Errorf("full ID: got %+v, %v; want %s", m, err, idA)
		}
	})
}

// TestAutoKeepsWhatItFound: an engine auto found once and missing later
// (its daemon restarting) is asked all the same, and the truth is
// unknown; without Found it is left out, and the rest vouch alone.
func TestAutoKeepsWhatItFound(t *testing.T) {
	present := true
	specsMu.Lock()
	saved := specs
	specs = map[string]Spec{
		"podman": {Name: "podman", Detect: func(Config) (string, bool) { return "fake://podman", true },
			New: func(Config) (Engine, error) { return &fake{name: "podman", a: Answer{UID: 0}}, nil }},
		"docker": {Name: "docker", Detect: func(Config) (string, bool) { return "fake://docker", present },
			New: func(c Config) (Engine, error) {
				if c.Detected != "fake://docker" {
					return nil, fmt.Errorf("docker made for %q, not where it was found", c.Detected)
				}
				if !present {
					return &fake{name: "docker", err: errors.New("dial: no such file or directory")}, nil
				}
				return &fake{name: "docker", a: Answer{UID: 0}}, nil
			}},
	}
	specsMu.Unlock()
	t.Cleanup(func() {
		specsMu.Lock()
		specs = saved
		specsMu.Unlock()
	})
	ask := func(cfg Config) ([]string, error) {
		es, err := Select(nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		_, err = Ask(t.Context(), es)
		return names, err
	}
	found := NewFound()
	if names, err := ask(Config{Found: found}); err != nil || !slices.Equal(names, []string{"podman", "docker"}) {
		t.Fatalf("both present: asked %v: %v", names, err)
	}
	present = false
	if names, err := ask(Config{Found: found}); !errors.Is(err, ErrUnknown) || !slices.Equal(names, []string{"podman", "docker"}) {
		t.Errorf("docker missing after it was found: asked %v: %v, want both asked and the truth unknown", names, err)
	}
	if names, err := ask(Config{}); err != nil || !slices.Equal(names, []string{"podman"}) {
		t.Errorf("docker missing, no Found: asked %v: %v, want podman alone", names, err)
	}
	present = true
	if names, err := ask(Config{Found: found}); err != nil || len(names) != 2 {
		t.Errorf("docker back: asked %v: %v", names, err)
	}
}

// narrowing is a fake engine that can be asked about some containers:
// LiveOf answers through filter, by default the containers of its answer
// the IDs name.
type narrowing struct {
	fake
	filter func(a Answer, ids []string) Answer
	whole  bool
	asked  [][]string
	wholes int
}

func (n *narrowing) Live(ctx context.Context) (Answer, error) {
	n.wholes++
	return n.fake.Live(ctx)
}

func (n *narrowing) LiveOf(_ context.Context, ids []string) (Answer, bool, error) {
	n.asked = append(n.asked, ids)
	a := n.a
	a.Engine = n.name
	if n.filter != nil {
		return n.filter(a, ids), n.whole, n.err
	}
	a.Containers = slices.DeleteFunc(slices.Clone(a.Containers), func(c Container) bool { return !slices.Contains(ids, c.ID) })
	return a, n.whole, n.err
}

// TestAskAbout: asked again about some containers, an engine that can
// narrow its list gives their state as of now and leaves the rest as its
// earlier answer had it; one that cannot, whose answer now comes from
// elsewhere, or that drops the canary it was asked about too, is asked
// for its whole list.
func TestAskAbout(t *testing.T) {
	before := Answer{Engine: "docker", Endpoint: "fake://docker", Source: SourceAPI, UID: 0, Containers: []Container{
		{ID: idA, State: "exited"},
		{ID: idB, State: "running", Live: true, InitPID: 7},
	}}
	now := Answer{Endpoint: "fake://docker", Source: SourceAPI, UID: 0, Containers: []Container{
		{ID: idA, State: "running", Live: true, InitPID: 9},
		{ID: idB, State: "exited"}, // not asked about: the earlier answer stands
		{ID: idC, State: "running", Live: true},
	}}
	for _, tc := range []struct {
		name       string
		ids        []string
		changed    func(*narrowing)
		wantLive   []string
		wantNarrow int
		wantWhole  int
	}{
		{"narrowed", []string{idA}, nil, []string{idA, idB}, 1, 0},
		{"the filter ignored", []string{idA}, func(n *narrowing) { n.filter = func(a Answer, _ []string) Answer { return a } }, []string{idA, idB}, 1, 0},
		{"asked about one it lists no more", []string{idB}, func(n *narrowing) {
			n.a.Containers = slices.DeleteFunc(n.a.Containers, func(c Container) bool { return c.ID == idB })
		}, nil, 1, 0},
		{"the canary missing: the filter misapplied", []string{idA}, func(n *narrowing) {
			n.filter = func(a Answer, _ []string) Answer { a.Containers = nil; return a }
		}, []string{idA, idC}, 1, 1},
		{"another UID answers", []string{idA}, func(n *narrowing) { n.a.UID = 1000 }, []string{idA, idC}, 1, 1},
		{"another source answers", []string{idA}, func(n *narrowing) { n.a.Source = SourceCLI }, []string{idA, idC}, 1, 1},
		{"another endpoint answers", []string{idA}, func(n *narrowing) { n.a.Endpoint = "fake://other" }, []string{idA, idC}, 1, 1},
		{"too many to name", slices.Repeat([]string{idA}, maxNarrow), nil, []string{idA, idC}, 0, 1},
		{"no other container to check the answer with", []string{idA, idB}, nil, []string{idA, idC}, 0, 1},
		{"a whole list from elsewhere", []string{idA}, func(n *narrowing) {
			n.whole, n.a.Source = true, SourceCLI
			n.filter = func(a Answer, _ []string) Answer { return a }
		}, []string{idA, idC}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &narrowing{fake: fake{name: "docker", a: now}}
			e.a.Containers = slices.Clone(now.Containers)
			if tc.changed != nil {
				tc.changed(e)
			}
			tr, err := AskAbout(t.Context(), []Engine{e}, tc.ids, Truth{Answers: []Answer{before}})
			if err != nil {
				t.Fatal(err)
			}
			if got := liveOf(tr.Set); !slices.Equal(got, tc.wantLive) {
				t.Errorf("live %v, want %v", got, tc.wantLive)
			}
			if len(e.asked) != tc.wantNarrow || e.wholes != tc.wantWhole {
				t.Errorf("asked about some %d times and for the whole list %d, want %d and %d", len(e.asked), e.wholes, tc.wantNarrow, tc.wantWhole)
			}
			if len(e.asked) > 0 && len(tc.ids) == 1 && !slices.Equal(e.asked[0], []string{tc.ids[0], otherThan(before, tc.ids[0])}) {
				t.Errorf("asked about %v, want %s and a canary the first answer listed", e.asked[0], tc.ids[0])
			}
			if tc.name == "narrowed" && (tr.Set.PIDs[idA] != 9 || tr.Set.PIDs[idB] != 7 || tr.Statuses[0].Containers != 2) {
				t.Errorf("PIDs %v, statuses %+v: want idA's from now, idB's from before, two containers", tr.Set.PIDs, tr.Statuses)
			}
		})
	}
	t.Run("a live canary first", func(t *testing.T) {
		e := &narrowing{fake: fake{name: "docker", a: now}}
		if _, err := AskAbout(t.Context(), []Engine{e}, []string{idC}, Truth{Answers: []Answer{before}}); err != nil {
			t.Fatal(err)
		}
		if len(e.asked) != 1 || !slices.Equal(e.asked[0], []string{idC, idB}) {
			t.Errorf("asked about %v, want %s and the live %s, not the exited %s", e.asked, idC[:12], idB[:12], idA[:12])
		}
	})
	t.Run("an engine that cannot narrow", func(t *testing.T) {
		e := &fake{name: "docker", a: now}
		tr, err := AskAbout(t.Context(), []Engine{e}, []string{idA}, Truth{Answers: []Answer{before}})
		if err != nil {
			t.Fatal(err)
		}
		if got := liveOf(tr.Set); !slices.Equal(got, []string{idA, idC}) {
			t.Errorf("live %v, want its whole answer's", got)
		}
	})
	t.Run("the narrowed question fails", func(t *testing.T) {
		e := &narrowing{fake: fake{name: "docker", err: errors.New("boom")}}
		if _, err := AskAbout(t.Context(), []Engine{e}, []string{idA}, Truth{Answers: []Answer{before}}); !errors.Is(err, ErrUnknown) {
			t.Errorf("err %v, want ground truth unknown", err)
		}
	})
	t.Run("an engine that answered before is gone", func(t *testing.T) {
		e := &narrowing{fake: fake{name: "podman", a: now}}
		if _, err := AskAbout(t.Context(), []Engine{e}, []string{idA}, Truth{Answers: []Answer{before}}); !errors.Is(err, ErrUnknown) || len(e.asked)+e.wholes != 0 {
			t.Errorf("err %v after %d questions, want ground truth unknown and none asked", err, len(e.asked)+e.wholes)
		}
	})
	t.Run("an engine found since", func(t *testing.T) {
		d := &narrowing{fake: fake{name: "docker", a: now}}
		p := &narrowing{fake: fake{name: "podman", a: Answer{Endpoint: "fake://podman", Source: SourceAPI, Containers: []Container{{ID: idB, State: "running", Live: true}}}}}
		tr, err := AskAbout(t.Context(), []Engine{d, p}, []string{idB}, Truth{Answers: []Answer{before}})
		if err != nil {
			t.Fatal(err)
		}
		if !tr.Set.IsLive(idB) || p.wholes != 1 || len(p.asked) != 0 {
			t.Errorf("live %v; the new engine asked %d times about some, %d for its list: want its whole list, calling %s live", liveOf(tr.Set), len(p.asked), p.wholes, idB[:12])
		}
	})
}

// otherThan is the first container of a whose ID is not id.
func otherThan(a Answer, id string) string {
	for _, c := range a.Containers {
		if c.ID != id {
			return c.ID
		}
	}
	return ""
}

func liveOf(s Set) []string {
	var ids []string
	for id := range s.Live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// TestMatchRefPods: a kubelet's namespace/pod/container names its
// container on every engine that reports it (containerd fills Pod, not
// Names), never a prefix of anything.
func TestMatchRefPods(t *testing.T) {
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	c := strings.Repeat("c", 64)
	cs := []Container{
		{ID: a, Pod: "default/web-7d9f/app", Live: true},
		{ID: b, Names: []string{"sidecar"}, Pod: "default/web-7d9f/sidecar"},
		// The kubelet keeps a restarted container's exited attempt.
		{ID: c, Pod: "default/web-7d9f/app"},
	}
	for _, tc := range []struct {
		ref  string
		want []string
	}{
		{"default/web-7d9f/app", []string{a}},
		{"default/web-7d9f/sidecar", []string{b}},
		{"sidecar", []string{b}},
		{"default/web-7d9f", nil},
	} {
		var got []string
		for _, m := range MatchRef("containerd", cs, tc.ref) {
			got = append(got, m.ID)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("MatchRef(%q) = %v, want %v", tc.ref, got, tc.want)
		}
	}
}
