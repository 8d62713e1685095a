package reap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

func randomID(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// startSleep starts a same-UID sleep in a session of its own: a bystander.
func startSleep(t *testing.T, arg string) fingerprint.Stat {
	t.Helper()
	return testutil.StartSleep(t, &syscall.SysProcAttr{Setsid: true}, arg)
}

// sleepers finds the live sleeps whose last argument is one of args.
func sleepers(args ...string) map[string]fingerprint.Stat {
	out := map[string]fingerprint.Stat{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		id, err := fingerprint.Read(fingerprint.DefaultRoot, pid)
		if err != nil || id.Zombie() || id.Comm != "sleep" || len(id.Argv) == 0 {
			continue
		}
		for _, a := range args {
			if id.Argv[len(id.Argv)-1] == a {
				out[a] = id.Stat
			}
		}
	}
	return out
}

// cgroup2Host skips a test that needs root on cgroup v2, and returns the
// host's containment.
func cgroup2Host(t *testing.T) contain.Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	h := contain.Detect(contain.Options{})
	if h.Kind != contain.KindCgroup2 {
		t.Skipf("no cgroup v2 here: %s", h.Why)
	}
	return h
}

// preparedCgroup makes kc-watchman/<id> for a new container ID (removed
// at cleanup) and a ledger holding the container's record, which names
// the cgroup when recorded.
func preparedCgroup(t *testing.T, h contain.Host, recorded bool) (string, *contain.Cgroup, *ledger.Store) {
	t.Helper()
	id := randomID(t)
	cg, err := contain.Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close(); testutil.RemoveContainCgroups(t, id) })
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(id, func(r *ledger.Record) error {
		if recorded {
			lc := cg.Record()
			r.Cgroup = &lc
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return id, cg, store
}

// TestRunSweepsTheRecordedCgroup: a contained tree whose wrapper died
// without its teardown (SIGKILL, OOM) has a kernel's setsid child and a
// double-forked daemon, which no group kill nor walk reaches: the daemon
// was reparented to PID 1 before any scan. The poststop's one reap path
// kills the group, then sweeps the cgroup its record names: all three
// die, the cgroup is removed and recorded so, and a same-UID process
// outside lives. Before the sweep, the daemon lived on. Without a record
// of the cgroup (a supervisor started by hand, without a ledger), the
// poststop finds kc-watchman/<id> itself.
func TestRunSweepsTheRecordedCgroup(t *testing.T) {
	h := cgroup2Host(t)
	for _, tc := range []struct {
		name     string
		recorded bool
	}{
		{"named by the record", true},
		{"found on cgroupfs", false},
	} {
		t.Run(tc.name, func(t *testing.T) { sweepsContainedTree(t, h, tc.recorded) })
	}
}

func sweepsContainedTree(t *testing.T, h contain.Host, recorded bool) {
	id, cg, store := preparedCgroup(t, h, recorded)

	// Durations of this run's own: other tests sleep too.
	base := 5000000 + int(time.Now().UnixNano()%1000000)*4
	arg := func(i int) string { return strconv.Itoa(base + i) }
	bystander := startSleep(t, arg(3))
	fd, _ := cg.CloneFD()
	tree := exec.Command("bash", "-c", `setsid sleep `+arg(0)+` & (setsid sleep `+arg(1)+` &); exec -a --container-id=`+id+` sleep `+arg(2))
	tree.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, UseCgroupFD: true, CgroupFD: fd}
	if err := tree.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tree.Process.Kill(); tree.Wait() })
	var procs map[string]fingerprint.Stat
	deadline := time.Now().Add(10 * time.Second)
	for procs = sleepers(arg(0), arg(1), arg(2)); len(procs) < 3; procs = sleepers(arg(0), arg(1), arg(2)) {
		if time.Now().After(deadline) {
			t.Fatalf("the tree did not start: %v", procs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if procs[arg(1)].PPID == tree.Process.Pid {
		t.Fatalf("the daemon %+v was not orphaned", procs[arg(1)])
	}

	found, _, err := trees.Scan(trees.Options{Comms: []string{"sleep"}, Only: map[string]bool{id: true}})
	if err != nil || len(found) != 1 {
		t.Fatalf("scan: %+v, %v", found, err)
	}
	res := Run(context.Background(), Options{Store: store, Source: "poststop", Grace: time.Second},
		Container{ID: id, Trees: []Tree{{Tree: found[0], HostUID: found[0].UID}}, All: true})
	for a, st := range procs {
		// The tree's own child (a zombie until its parent is reaped) is dead too.
		if fingerprint.Alive(fingerprint.DefaultRoot, st) {
			t.Errorf("sleep %s (pid %d) lives on", a, st.PID)
		}
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, bystander) {
		t.Error("a same-UID process outside the cgroup was killed")
	}
	if res.Cgroup == nil || !res.Cgroup.Removed || res.Cgroup.Outcome != action.Reaped || res.Outcome != action.Reaped {
		t.Errorf("result %+v, cgroup %+v: want the cgroup reaped and removed", res, res.Cgroup)
	}
	if _, err := os.Lstat(filepath.Join(cg.Mount, cg.Path)); !os.IsNotExist(err) {
		t.Errorf("the cgroup is still there: %v", err)
	}
	rec, err := store.Load(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cgroup == nil || !rec.Cgroup.Removed {
		t.Errorf("recorded cgroup %+v, want removed", rec.Cgroup)
	}
}

// TestRunRefusesAnEscapingCgroup: a record whose cgroup path leads out of
// kc-watchman/<id> ("..", another place, another container's) is refused
// and recorded so; the process in the cgroup it points at lives.
func TestRunRefusesAnEscapingCgroup(t *testing.T) {
	cgroup2Host(t)
	victim := testutil.MakeCgroup(t, "victim")
	inside := startSleep(t, strconv.Itoa(6000000+int(time.Now().UnixNano()%1000000)))
	if err := os.WriteFile(filepath.Join(victim.Dir, "cgroup.procs"), []byte(strconv.Itoa(inside.PID)), 0); err != nil {
		t.Fatal(err)
	}
	id := randomID(t)
	rel := strings.TrimPrefix(victim.Path, "/")
	for _, path := range []string{
		"kc-watchman/../" + rel,
		"kc-watchman/" + id + "/../../" + rel,
		"/" + rel,
		rel,
		"kc-watchman/" + randomID(t),
	} {
		t.Run(path, func(t *testing.T) {
			store, err := ledger.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Update(id, func(r *ledger.Record) error {
				r.Cgroup = &ledger.Cgroup{Kind: "cgroup2", Path: path, UID: os.Getuid()}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			res := Run(context.Background(), Options{Store: store, Source: "poststop"}, Container{ID: id, All: true})
			if res.Cgroup == nil || res.Cgroup.Outcome != action.SkipForeign || res.Cgroup.Removed {
				t.Errorf("cgroup %+v, want refused", res.Cgroup)
			}
			if !fingerprint.Alive(fingerprint.DefaultRoot, inside) {
				t.Fatal("the process in the cgroup the record pointed at was killed")
			}
			if _, err := os.Lstat(victim.Dir); err != nil {
				t.Errorf("the cgroup the record pointed at: %v", err)
			}
			rec, err := store.Load(id)
			if err != nil || rec.Cgroup == nil || rec.Cgroup.Outcome != action.SkipForeign {
				t.Errorf("recorded %+v (%v), want refused", rec, err)
			}
		})
	}
}

// TestRunLeavesACgroupItsDecisionDoesNotCover: a run that signals no tree
// of the cgroup's UID (here none at all, as a reconcile whose engine
// vouched for another UID's trees only) and is not the hook's poststop
// leaves the container's cgroup and what is in it, recorded or found.
func TestRunLeavesACgroupItsDecisionDoesNotCover(t *testing.T) {
	h := cgroup2Host(t)
	for _, tc := range []struct {
		recorded bool
		c        func(id string) Container
	}{
		{true, func(id string) Container { return Container{ID: id} }},
		{false, func(id string) Container { return Container{ID: id} }},
		// Even the container's own poststop leaves it when the caller
		// spared another tree of the container, which it may hold.
		{true, func(id string) Container { return Container{ID: id, All: true, KeepCgroup: true} }},
	} {
		recorded := tc.recorded
		t.Run(fmt.Sprintf("recorded=%v/%+v", recorded, tc.c("x")), func(t *testing.T) {
			id, cg, store := preparedCgroup(t, h, recorded)
			fd, _ := cg.CloneFD()
			st := testutil.StartSleep(t, &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: fd},
				strconv.Itoa(7000000+int(time.Now().UnixNano()%1000000)))
			res := Run(context.Background(), Options{Store: store, Source: "reconcile"}, tc.c(id))
			if res.Cgroup != nil {
				t.Errorf("cgroup %+v, want it left alone", res.Cgroup)
			}
			if !fingerprint.Alive(fingerprint.DefaultRoot, st) {
				t.Error("the process in the cgroup was killed")
			}
			if _, err := os.Lstat(filepath.Join(cg.Mount, cg.Path)); err != nil {
				t.Errorf("the cgroup: %v", err)
			}
		})
	}
}

// TestRunWithholdsFromTheRecordedCgroup: the sweep of the cgroup a record
// names kills what the caller decided about and nothing younger or spared:
// a process started after BornBefore (a restarted container's, put in the
// same cgroup after the decision) and one Spare names (a member of a tree
// the caller left alone) live, the older one dies, and the cgroup, still
// holding the two, is kept.
func TestRunWithholdsFromTheRecordedCgroup(t *testing.T) {
	h := cgroup2Host(t)
	id, cg, store := preparedCgroup(t, h, true)
	base := 7000000 + int(time.Now().UnixNano()%1000000)*4
	arg := func(i int) string { return strconv.Itoa(base + i) }
	fd, _ := cg.CloneFD()
	start := func(a string) fingerprint.Stat {
		t.Helper()
		cmd := exec.Command("sleep", a)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: fd}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		var st fingerprint.Stat
		var err error
		deadline := time.Now().Add(5 * time.Second)
		for st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid); err != nil || st.Comm != "sleep"; st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid) {
			if time.Now().After(deadline) {
				t.Fatalf("sleep %s did not start: %+v, %v", a, st, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return st
	}
	old := start(arg(0))
	spared := start(arg(1))
	// Start ticks count in hundredths: the newborn must be a tick younger
	// than the decision.
	var young fingerprint.Stat
	for i := 0; ; i++ {
		if young = start(arg(2 + i)); young.StartTicks > old.StartTicks && young.StartTicks > spared.StartTicks {
			break
		}
		if i == 100 {
			t.Fatal("no process younger than the first two by a tick")
		}
	}
	bornBefore := max(old.StartTicks, spared.StartTicks) + 1
	res := Run(context.Background(), Options{
		Store: store, Source: "reconcile", Grace: time.Second, BornBefore: bornBefore,
		Spare: func(st fingerprint.Stat) bool { return st.PID == spared.PID && st.StartTicks == spared.StartTicks },
	}, Container{ID: id, All: true})
	deadline := time.Now().Add(5 * time.Second)
	for fingerprint.Alive(fingerprint.DefaultRoot, old) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if fingerprint.Alive(fingerprint.DefaultRoot, old) {
		t.Error("the process the decision covered lives on")
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, young) {
		t.Error("a process started after the decision was killed")
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, spared) {
		t.Error("a spared process was killed")
	}
	if res.Cgroup == nil || res.Cgroup.Removed {
		t.Errorf("cgroup %+v: want it swept and kept (it still holds the withheld)", res.Cgroup)
	}
	if _, err := os.Lstat(filepath.Join(cg.Mount, cg.Path)); err != nil {
		t.Errorf("the cgroup holding the withheld: %v", err)
	}
}
