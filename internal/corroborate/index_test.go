package corroborate

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// hybridChildren are n monitor children of container IDs ids[i%len(ids)],
// each with a cgroup v1 hybrid's ten lines: the container's own cgroup
// named as engine i%4 names it, a monitor's, kc-watchman's and the roots.
func hybridChildren(ids []string, n int) []child {
	own := []func(id string) string{
		func(id string) string { return "/machine.slice/libpod-" + id + ".scope/container" },
		func(id string) string { return "/system.slice/docker-" + id + ".scope" },
		func(id string) string { return "/k8s.io/" + id },
		func(id string) string { return "/kubepods/besteffort/pod1/crio-" + id },
	}
	var out []child
	for i := range n {
		id := ids[i%len(ids)]
		out = append(out, child{Stat: fingerprint.Stat{PID: 1000 + i}, uid: 0, cgroups: []string{
			"0::" + own[i%len(own)](id),
			"9:name=systemd:/machine.slice/libpod-conmon-" + id + ".scope",
			"8:pids:/kc-watchman/" + id,
			"7:memory:" + own[(i+1)%len(own)](id) + "/runtime",
			"6:cpu:/user.slice",
			"5:blkio:/user.slice",
			"4:freezer:/" + id + "/sub",
			"3:devices:/user.slice",
			"2:cpuset:/user.slice",
			"1:cpuacct:/user.slice",
		}})
	}
	return out
}

// TestCandidatesHoldEveryMatch: the index Check looks children up in
// finds every child inContainer takes for a container, by its engine's
// name or by a recorded line, and the children of other containers not.
func TestCandidatesHoldEveryMatch(t *testing.T) {
	ids := make([]string, 7)
	for i := range ids {
		ids[i] = fmt.Sprintf("%064x", i+1)
	}
	c := &Checker{children: hybridChildren(ids, 60)}
	c.index()
	for _, id := range append(ids, fmt.Sprintf("%064x", 99)) {
		for _, exact := range [][]string{nil, {"0::/system.slice/docker-" + id + ".scope"}, {"8:pids:/kc-watchman/" + id, "6:cpu:/user.slice"}} {
			t.Run(fmt.Sprintf("%.4s/%d", id[60:], len(exact)), func(t *testing.T) {
				var want []int
				for i, ch := range c.children {
					if _, ok := c.inContainer(ch.cgroups, id, exact); ok {
						want = append(want, i)
					}
				}
				got := c.candidates(id, exact)
				for _, i := range want {
					if !slices.Contains(got, i) {
						t.Errorf("child %d (%v) matches and is no candidate (candidates %v)", i, c.children[i].cgroups, got)
					}
				}
				if len(exact) == 0 && !slices.Equal(got, want) {
					t.Errorf("candidates %v, want the matches %v", got, want)
				}
			})
		}
	}
}

// BenchmarkCheck: 100 stray candidates against the children of 200 live
// containers, ten cgroup lines each (a hybrid host): a lookup per
// candidate, where matching every child's lines took 40,000 name checks.
func BenchmarkCheck(b *testing.B) {
	var ids []string
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("%064x", i+1))
	}
	var strays []string
	for i := range 100 {
		strays = append(strays, fmt.Sprintf("%064x", 1000+i))
	}
	children := hybridChildren(ids, len(ids))
	for b.Loop() {
		c := &Checker{children: children, scanned: true}
		c.index()
		for _, id := range strays {
			if _, ok, _ := c.Check(Query{ID: id}); ok {
				b.Fatal("evidence for a container with no child")
			}
		}
	}
}

// TestNamedIDs: the IDs a path is indexed under are exactly those
// NameMatches takes it for (checked against every ID a component of the
// path could name).
func TestNamedIDs(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, path := range []string{
		"/machine.slice/libpod-" + id + ".scope/container/init.scope",
		"/machine.slice/libpod-conmon-" + id + ".scope",
		"/libpod_parent/libpod-payload-" + id,
		"/kubepods.slice/cri-containerd-" + id + ".scope",
		"/crio-" + id, "/k8s.io/" + id + "/", "/docker-.scope", "/libpod-", "/", "",
	} {
		ids := namedIDs(path)
		name := ownName(path)
		for i := range len(name) + 1 {
			for j := i; j <= len(name); j++ {
				cand := name[i:j]
				if got, want := slices.Contains(ids, cand), NameMatches(path, cand); got != want {
					t.Errorf("%q: %q indexed %v, NameMatches %v (indexed under %q)", path, cand, got, want, ids)
				}
			}
		}
		if NameMatches(path, id) && !slices.Contains(ids, id) {
			t.Errorf("%q: not indexed under its container's ID (%q)", path, ids)
		}
	}
}
