package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// startMonitor starts a real process whose comm is comm (conmon, or
// containerd-shim for containerd-shim-runc-v2) with argv args, as a
// monitor runs, and, unless cg is nil, a child of it that moves itself
// into cg, as a container's init is the monitor's child in the
// container's cgroup; setpriv, when not empty, is the child's setpriv
// arguments (another UID). It returns the monitor's PID and the child's.
func startMonitor(t *testing.T, comm string, cg *testutil.Cgroup, setpriv []string, args ...string) (int, int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), comm)
	if err := testutil.CopyFile("/bin/sh", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// The shell forks the child: start it in a group of its own so that
	// cleanup kills both, not the shell alone.
	script := "sleep 1000; :"
	if cg != nil {
		script = `sh -c 'echo 0 > "$0/cgroup.procs" && exec "$@" sleep 1000' "$CG" $SETPRIV & wait`
	}
	cmd := exec.Command(bin, append([]string{"-c", script, comm}, args...)...)
	cmd.Env = append(os.Environ(), "SETPRIV=")
	if cg != nil {
		cmd.Env = append(cmd.Env, "CG="+cg.Dir)
		if len(setpriv) > 0 {
			cmd.Env = append(cmd.Env, "SETPRIV=setpriv "+strings.Join(setpriv, " "))
		}
	}
	proc.StartGroup(t, cmd)
	child := 0
	proc.WaitFor(t, 10*time.Second, "the monitor and its child to run", func() bool {
		id, err := fingerprint.Read("/proc", cmd.Process.Pid)
		// The kernel cuts comm to 15 bytes.
		if err != nil || id.Comm != comm[:min(len(comm), 15)] || len(id.Argv) < 3 {
			return false
		}
		for _, pid := range proc.GroupMembers(cmd.Process.Pid) {
			if pid == cmd.Process.Pid {
				continue
			}
			cid, err := fingerprint.Read("/proc", pid)
			if err != nil || cid.Comm != "sleep" {
				continue
			}
			if cg == nil {
				child = pid
				return true
			}
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if err == nil && strings.Contains(string(data), "::"+cg.Path+"\n") {
				child = pid
				return true
			}
		}
		return false
	})
	return cmd.Process.Pid, child
}

// TestCorroboration: an engine answer that omits a container whose conmon
// (or ledger-recorded init) is alive is contradicted. One contradiction
// spares that tree; two make the whole run unknown, with nothing touched.
func TestCorroboration(t *testing.T) {
	const comm = "kcsrv-corrob"
	const (
		cidMon  = "6666666666666666666666666666666666666666666666666666666666666666"
		cidInit = "7777777777777777777777777777777777777777777777777777777777777777"
		cidGone = "8888888888888888888888888888888888888888888888888888888888888888"
	)
	empty := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
	// MinAge 0: no age rule. Ages count in clock ticks, so a tree scanned in
	// its first tick is 0 old and any positive minimum would call it young.
	base := Options{Comms: []string{comm}, KillGrace: 200 * time.Millisecond, Apply: true}

	t.Run("a live conmon spares its tree; others are reaped", func(t *testing.T) {
		kept := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidMon})
		gone := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidGone})
		startMonitor(t, "conmon", podmanCgroup(t, cidMon), nil, "-c", cidMon)
		opt := base
		opt.Containers = map[string]bool{cidMon: true, cidGone: true}
		rep, err := Run(context.Background(), opt, empty)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, kept.PGID); tr == nil || tr.Action != action.SkipContradicted {
			t.Fatalf("tree of a container whose conmon runs: %+v", tr)
		}
		if tr := findByPGID(rep, gone.PGID); tr == nil || tr.Action != action.Reaped {
			t.Fatalf("stray tree: %+v", tr)
		}
		if !running(kept.PID) {
			t.Fatal("the contradicted tree was signalled")
		}
	})

	t.Run("two contradictions: wrong store, nothing touched", func(t *testing.T) {
		a := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidMon})
		b := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidInit})
		c := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidGone})
		startMonitor(t, "conmon", podmanCgroup(t, cidMon), nil, "-c", cidMon)
		// The init the hook recorded for cidInit: a live process of
		// this boot, no poststop.
		initCmd := exec.Command("sleep", "1000")
		proc.Start(t, initCmd)
		st := startOf(t, initCmd.Process.Pid)
		store := recordedStore(t, cidInit, func(r *ledger.Record) {
			r.Init = &ledger.Process{PID: initCmd.Process.Pid, StartTicks: st}
		})
		opt := base
		opt.Store = store
		opt.Containers = map[string]bool{cidMon: true, cidInit: true, cidGone: true}
		rep, err := Run(context.Background(), opt, empty)
		if !errors.Is(err, ErrWrongStore) || !errors.Is(err, engine.ErrUnknown) {
			t.Fatalf("err = %v, want the wrong-store error", err)
		}
		for _, pid := range []int{a.PID, b.PID, c.PID} {
			if !running(pid) {
				t.Fatalf("tree %d was touched", pid)
			}
		}
		// Nor reported as one a run would reap: the answer is wrong
		// for it too.
		if tr := findByPGID(rep, c.PGID); tr == nil || tr.Action != action.SkipContradicted {
			t.Fatalf("uncontradicted tree: %+v", tr)
		}
		if rep.LivenessKnown || rep.Source != "" {
			t.Errorf("report says liveness known %v, source %q; want unknown, no source", rep.LivenessKnown, rep.Source)
		}
	})

	// The first run spares the tree; its --apply must not then collect
	// the ledger record that was the evidence, or the next run, seeing no
	// evidence left, reaps the tree of a container that still runs.
	t.Run("the evidence outlives an apply run", func(t *testing.T) {
		kept := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: cidInit})
		initCmd := exec.Command("sleep", "1000")
		proc.Start(t, initCmd)
		st := startOf(t, initCmd.Process.Pid)
		store := recordedStore(t, cidInit, func(r *ledger.Record) {
			r.Init = &ledger.Process{PID: initCmd.Process.Pid, StartTicks: st}
		})
		opt := base
		opt.Store = store
		opt.Containers = map[string]bool{cidInit: true}
		for run := 1; run <= 2; run++ {
			rep, err := Run(context.Background(), opt, empty)
			if err != nil {
				t.Fatal(err)
			}
			if tr := findByPGID(rep, kept.PGID); tr == nil || tr.Action != action.SkipContradicted {
				t.Fatalf("run %d: tree of a container whose init runs: %+v", run, tr)
			}
			if rep.LedgerCollected != 0 {
				t.Fatalf("run %d collected %d records", run, rep.LedgerCollected)
			}
			if _, err := store.Load(cidInit); err != nil {
				t.Fatalf("run %d: the record is gone: %v", run, err)
			}
		}
		if !running(kept.PID) {
			t.Fatal("the contradicted tree was signalled")
		}
	})
}

func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.StartTicks
}

func running(pid int) bool {
	st, err := fingerprint.ReadStat("/proc", pid)
	return err == nil && !st.Zombie()
}

// podmanCgroup is a cgroup named as podman's cgroupfs manager names a
// container's: libpod-<id> under libpod_parent.
func podmanCgroup(t *testing.T, id string) *testutil.Cgroup {
	cg := testutil.MakeCgroup(t, "libpod_parent", "libpod-"+id)
	return &cg
}

// TestEvidenceOfRunning: the rules of DESIGN "Ground truth must be corroborated" with real monitors and
// real processes in real cgroups. Evidence is of running, not existing.
func TestEvidenceOfRunning(t *testing.T) {
	const comm = "kcsrv-evidence"
	const (
		sandbox = "1111111111111111111111111111111111111111111111111111111111111111"
		app     = "2222222222222222222222222222222222222222222222222222222222222222"
		other   = "3333333333333333333333333333333333333333333333333333333333333333"
	)
	empty := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, States: map[string]string{}, UID: os.Geteuid()}
	base := Options{Comms: []string{comm}, KillGrace: 200 * time.Millisecond}
	one := func(t *testing.T, opt Options, live engine.Set, pgid int) (Tree, error) {
		t.Helper()
		rep, err := Run(context.Background(), opt, live)
		tr := findByPGID(rep, pgid)
		if tr == nil {
			t.Fatalf("tree %d not in the report (err %v)", pgid, err)
		}
		return *tr, err
	}
	// recorded runs app's decision with these cgroup lines recorded for
	// it (as the hook records the init's), wants the tree's action, and
	// returns the options for another run.
	recorded := func(t *testing.T, pgid int, lines []string, want action.Action) Options {
		t.Helper()
		opt := base
		opt.Store = recordedStore(t, app, func(r *ledger.Record) { r.Cgroups = lines })
		opt.Containers = map[string]bool{app: true}
		if tr, _ := one(t, opt, empty, pgid); tr.Action != want {
			t.Fatalf("tree: %s, want %s (%v)", tr.Action, want, deref(tr.Error))
		}
		return opt
	}

	// Finding 1: a pod's shim carries only the sandbox's ID; the app
	// container's init is its child, in /<namespace>/<app>.
	t.Run("a pod's app container runs in its cgroup under the sandbox's shim", func(t *testing.T) {
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		cg := testutil.MakeCgroup(t, "k8s.io", app)
		startMonitor(t, "containerd-shim-runc-v2", &cg, nil, "-namespace", "k8s.io", "-id", sandbox, "-address", "/run/containerd/containerd.sock")
		// The /proc listing has no parent links: the shim's children
		// files are read instead.
		for _, l := range []proctable.Lister{proctable.ListAuto, proctable.ListProc} {
			opt := base
			opt.Lister = l
			opt.Containers = map[string]bool{app: true}
			tr, err := one(t, opt, empty, tree.PGID)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Action != action.SkipContradicted {
				t.Fatalf("--bpf %s: app container's tree: %s, want %s", l, tr.Action, action.SkipContradicted)
			}
		}
	})

	// Finding 2: a task that exited and was not deleted keeps its shim,
	// with no child: its container is dead.
	t.Run("a shim with no child in the container's cgroup is no evidence", func(t *testing.T) {
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		startMonitor(t, "containerd-shim-runc-v2", nil, nil, "-namespace", "default", "-id", app)
		opt := base
		opt.Containers = map[string]bool{app: true}
		tr, err := one(t, opt, empty, tree.PGID)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Action != action.WouldReap {
			t.Fatalf("tree of an exited task: %s, want %s (%v)", tr.Action, action.WouldReap, deref(tr.Error))
		}
	})

	t.Run("a monitor's child in its own cgroup is no evidence", func(t *testing.T) {
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		cg := testutil.MakeCgroup(t, "machine.slice", "libpod-conmon-"+app+".scope")
		startMonitor(t, "conmon", &cg, nil, "-c", app)
		opt := base
		opt.Containers = map[string]bool{app: true}
		if tr, _ := one(t, opt, empty, tree.PGID); tr.Action != action.WouldReap {
			t.Fatalf("tree: %s, want %s (%v)", tr.Action, action.WouldReap, deref(tr.Error))
		}
	})

	// A rootful container run as a third UID (docker run --user): root's
	// shim's child in the container's cgroup, which no user can make.
	t.Run("another user's process under root's monitor, in a cgroup named after the container, is evidence", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to run the child as another UID")
		}
		if _, err := exec.LookPath("setpriv"); err != nil {
			t.Skip("no setpriv")
		}
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		cg := testutil.MakeCgroup(t, "default", app)
		startMonitor(t, "containerd-shim-runc-v2", &cg, []string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}, "-id", app)
		opt := base
		opt.Containers = map[string]bool{app: true}
		if tr, _ := one(t, opt, empty, tree.PGID); tr.Action != action.SkipContradicted {
			t.Fatalf("tree: %s, want %s (%v)", tr.Action, action.SkipContradicted, deref(tr.Error))
		}
	})

	t.Run("the recorded cgroup wins over names", func(t *testing.T) {
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		named := testutil.MakeCgroup(t, "default", app)
		startMonitor(t, "containerd-shim-runc-v2", &named, nil, "-id", app)
		// The hook recorded the init in another cgroup: one named after
		// the container is someone else's.
		opt := recorded(t, tree.PGID, []string{"0::/elsewhere/" + app}, action.WouldReap)
		if err := opt.Store.Update(app, func(r *ledger.Record) error {
			r.Cgroups = []string{"0::" + named.Path}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if tr, _ := one(t, opt, empty, tree.PGID); tr.Action != action.SkipContradicted {
			t.Fatalf("tree: %s, want %s", tr.Action, action.SkipContradicted)
		}
	})

	// A recorded line the child shares with its monitor is the monitor's
	// cgroup (or one the runtime did not move the init into): no
	// container's own.
	t.Run("a recorded cgroup the child shares with its monitor is no evidence", func(t *testing.T) {
		// The monitor and its child in a cgroup that is not this test's
		// own (which is never evidence anyway).
		shared := testutil.MakeCgroup(t, "monitor")
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		mon, child := startMonitor(t, "containerd-shim-runc-v2", nil, nil, "-id", app)
		for _, pid := range []int{mon, child} {
			if err := os.WriteFile(filepath.Join(shared.Dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
				t.Fatal(err)
			}
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", mon))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "::"+shared.Path+"\n") {
			t.Fatalf("the monitor is not in %s: %s", shared.Path, data)
		}
		recorded(t, tree.PGID, strings.Fields(string(data)), action.WouldReap)
	})

	// A process the container left in its recorded cgroup, under no
	// monitor (its init gone, no PID namespace), still runs it; the
	// tree's own member there does not.
	// A process the container left there may name itself conmon: only a
	// monitor started from outside the cgroup makes it the monitor's.
	t.Run("a process named like a monitor does not silence the recorded cgroup", func(t *testing.T) {
		cg := testutil.MakeCgroup(t, "default", app)
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		fake := filepath.Join(t.TempDir(), "conmon")
		if err := testutil.CopyFile("/bin/sh", fake, 0o755); err != nil {
			t.Fatal(err)
		}
		// The shell moves itself in, then starts the conmon-named
		// child (not exec'd: the "; :" after it).
		left := exec.Command("sh", "-c", `echo 0 > "$0/cgroup.procs" && "$1" -c 'sleep 1000; :'; :`, cg.Dir, fake)
		proc.StartGroup(t, left)
		proc.WaitFor(t, 10*time.Second, "the process and its conmon-named child in the cgroup", func() bool {
			data, err := os.ReadFile(filepath.Join(cg.Dir, "cgroup.procs"))
			if err != nil {
				return false
			}
			for _, f := range strings.Fields(string(data)) {
				if c, err := os.ReadFile("/proc/" + f + "/comm"); err == nil && strings.TrimSpace(string(c)) == "conmon" {
					return true
				}
			}
			return false
		})
		recorded(t, tree.PGID, []string{"0::" + cg.Path}, action.SkipContradicted)
	})

	t.Run("a process in the recorded cgroup under no monitor", func(t *testing.T) {
		// The cgroup first: its cleanup waits for the tree's, which it
		// will hold.
		cg := testutil.MakeCgroup(t, "default", app)
		tree := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		left := exec.Command("sh", "-c", `echo 0 > "$0/cgroup.procs" && exec sleep 1000`, cg.Dir)
		proc.StartGroup(t, left)
		proc.WaitFor(t, 10*time.Second, "the process in the cgroup", func() bool {
			data, err := os.ReadFile(filepath.Join(cg.Dir, "cgroup.procs"))
			return err == nil && strings.TrimSpace(string(data)) == fmt.Sprint(left.Process.Pid)
		})
		opt := recorded(t, tree.PGID, []string{"0::" + cg.Path}, action.SkipContradicted)
		// Now the tree's supervisor is the one in the cgroup.
		proc.KillGroup(t, left)
		if err := os.WriteFile(filepath.Join(cg.Dir, "cgroup.procs"), []byte(fmt.Sprint(tree.PID)), 0o644); err != nil {
			t.Fatal(err)
		}
		if tr, _ := one(t, opt, empty, tree.PGID); tr.Action != action.WouldReap {
			t.Fatalf("tree: %s, want %s (%v)", tr.Action, action.WouldReap, deref(tr.Error))
		}
	})

	t.Run("a container an engine lists as exited is contradicted only by its init", func(t *testing.T) {
		a := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		b := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: other})
		cga := testutil.MakeCgroup(t, "default", app)
		startMonitor(t, "containerd-shim-runc-v2", &cga, nil, "-id", app)
		cgb := testutil.MakeCgroup(t, "default", other)
		startMonitor(t, "containerd-shim-runc-v2", &cgb, nil, "-id", other)
		live := empty
		live.States = map[string]string{app: "stopped", other: "stopped"}
		opt := base
		opt.Containers = map[string]bool{app: true, other: true}
		rep, err := Run(context.Background(), opt, live)
		if err != nil {
			t.Fatalf("listed exited containers made the run fail: %v", err)
		}
		for _, pgid := range []int{a.PGID, b.PGID} {
			if tr := findByPGID(rep, pgid); tr == nil || tr.Action != action.WouldReap {
				t.Fatalf("tree %d: %+v, want would-reap", pgid, tr)
			}
		}
	})

	t.Run("only root's evidence of unknown containers makes a wrong store", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		// Two trees of UID 0 whose containers' processes run as root:
		// exit 3. The same with the evidence of one tree's container
		// listed as exited: contradicted by nothing, no exit 3.
		a := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: app})
		b := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: other})
		cga := testutil.MakeCgroup(t, "default", app)
		startMonitor(t, "containerd-shim-runc-v2", &cga, nil, "-id", app)
		cgb := testutil.MakeCgroup(t, "default", other)
		startMonitor(t, "containerd-shim-runc-v2", &cgb, nil, "-id", other)
		opt := base
		opt.Containers = map[string]bool{app: true, other: true}
		if _, err := Run(context.Background(), opt, empty); !errors.Is(err, ErrWrongStore) {
			t.Fatalf("err = %v, want the wrong-store error", err)
		}
		live := empty
		live.States = map[string]string{other: "stopped"}
		rep, err := Run(context.Background(), opt, live)
		if err != nil {
			t.Fatal(err)
		}
		if tr := findByPGID(rep, a.PGID); tr == nil || tr.Action != action.SkipContradicted {
			t.Fatalf("tree of an unknown running container: %+v", tr)
		}
		if tr := findByPGID(rep, b.PGID); tr == nil || tr.Action != action.WouldReap {
			t.Fatalf("tree of an exited container: %+v", tr)
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recordedStore is a ledger of its own holding id's record as the hook
// writes it at createRuntime, with edit applied.
func recordedStore(t *testing.T, id string, edit func(*ledger.Record)) *ledger.Store {
	t.Helper()
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(id, func(r *ledger.Record) error {
		edit(r)
		r.Stages = map[string]time.Time{"createRuntime": time.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return store
}
