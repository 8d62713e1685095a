package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// TestContainedTreeDiesWithContainer: a supervised tree whose kernel has a
// child in a session of its own and a double-forked daemon runs in the
// cgroup kc-hook supervise made for it (the wrapper outside it); podman
// kill takes the container down, and with it every process of the tree,
// escaped ones included, and the cgroup is removed and recorded so
// (DESIGN "Descendants that leave the group").
func TestContainedTreeDiesWithContainer(t *testing.T) {
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s); this test wants cgroup v2", h, h.Why)
	}
	s := newSuperviseEnvWith(t, []string{"KCFAKE_SETSID_CHILD=1", "KCFAKE_DAEMON_CHILD=1"})
	id := s.run(t, "fake")
	t.Cleanup(func() { testutil.RemoveContainCgroups(t, id) })
	tr := waitTree(t, id)
	dir := filepath.Join(h.Mount, contain.Dir, id)

	// The group (less the wrapper), the setsid child and the daemon.
	var in []fingerprint.Stat
	deadline := time.Now().Add(20 * time.Second)
	for {
		in = cgroupMembers(dir)
		if len(in) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cgroup %s holds %+v, want the supervisor, two kernels, a setsid child and a daemon", dir, in)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w := member(tr, trees.WrapperComm)
	outside := 0
	for _, p := range in {
		if p.PID == w.PID {
			t.Errorf("the wrapper %d is inside the cgroup it kills", w.PID)
		}
		if p.PGID != tr.PGID {
			outside++
		}
	}
	if outside < 2 {
		t.Errorf("%d processes of the cgroup outside the group, want the setsid child and the daemon: %+v", outside, in)
	}
	if _, err := s.pm.Podman("kill", "-s", "KILL", id); err != nil {
		t.Fatal(err)
	}
	waitAllDead(t, append(in, tr.Stats()...), 15*time.Second)
	deadline = time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Lstat(dir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cgroup %s is still there", dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	store, err := ledger.OpenReadOnly(s.state)
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		rec, err := store.Load(id)
		if err == nil && rec.Cgroup != nil && rec.Cgroup.Removed && rec.Cgroup.Path == contain.Dir+"/"+id {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger cgroup %+v (%v), want %s/%s removed", rec, err, contain.Dir, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupMembers are the live processes in the cgroup directory dir.
func cgroupMembers(dir string) []fingerprint.Stat {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []fingerprint.Stat
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid); err == nil && !st.Zombie() && !slices.ContainsFunc(out, func(o fingerprint.Stat) bool { return o.PID == pid }) {
			out = append(out, st)
		}
	}
	return out
}
