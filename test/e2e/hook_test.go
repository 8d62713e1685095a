package e2e

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

const otherContainer = "0000000000000000000000000000000000000000000000000000000000000042"

// TestHookReapsTreeOnStop is the hook's end-to-end test: a real container,
// a real supervisor tree on the host tagged with its ID, podman stop.
func TestHookReapsTreeOnStop(t *testing.T) {
	e := podmantest.New(t)
	state := t.TempDir()
	installHook(t, e, state)
	id := e.Run(t)
	sockDir := t.TempDir()

	// --ignore-term: the supervisor survives SIGTERM, so it dies by SIGKILL
	// without removing its socket, and the hook must unlink it.
	k, tree := startTree(t, sockDir, id, testutil.Fake{IgnoreTerm: true})
	// A tree of another container, and a foreign group (a shell that ran a
	// supervisor by hand) carrying this container's ID: both must survive.
	_, other := startTree(t, t.TempDir(), otherContainer, testutil.Fake{})
	foreign := startForeign(t, id)

	store, err := ledger.OpenReadOnly(state)
	if err != nil {
		t.Fatalf("createRuntime left no ledger: %v", err)
	}
	rec, err := store.Load(id)
	if err != nil || rec.Init == nil || rec.Init.PID != e.InitPID(t, id) {
		t.Fatalf("createRuntime record = %+v, %v; want init pid %d", rec, err, e.InitPID(t, id))
	}

	e.Stop(t, id)

	waitAllDead(t, tree, 5*time.Second)
	if _, err := os.Lstat(k.Socket); !os.IsNotExist(err) {
		t.Errorf("socket %s survived the stop: %v", k.Socket, err)
	}
	if n := len(aliveOf(other)); n != len(other) {
		t.Errorf("another container's tree lost %d members", len(other)-n)
	}
	if n := len(aliveOf(foreign)); n != len(foreign) {
		t.Errorf("the foreign group lost %d members", len(foreign)-n)
	}

	rec, err = store.Load(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != "reaped" || rec.Stages["poststop"].IsZero() {
		t.Errorf("record outcome %q, stages %v", rec.Outcome, rec.Stages)
	}
	var reaped *ledger.Tree
	for i := range rec.Trees {
		if rec.Trees[i].PGID == k.PGID {
			reaped = &rec.Trees[i]
		}
	}
	if reaped == nil || reaped.Action != "reaped" || len(reaped.Members) < 4 {
		t.Fatalf("ledger trees = %+v", rec.Trees)
	}
	if !slices.Contains(reaped.Sockets, k.Socket) || !slices.Contains(reaped.SocketsUnlinked, k.Socket) {
		t.Errorf("ledger sockets %v, unlinked %v; want %s", reaped.Sockets, reaped.SocketsUnlinked, k.Socket)
	}
}

// TestHookOnRestart checks that poststop fires on every stop: a tree
// attached before each restart is gone after it, and the container keeps
// working.
func TestHookOnRestart(t *testing.T) {
	e := podmantest.New(t)
	state := t.TempDir()
	installHook(t, e, state)
	id := e.Run(t)
	for i := 0; i < 2; i++ {
		_, tree := startTree(t, t.TempDir(), id, testutil.Fake{})
		if _, err := e.Podman("restart", "-t", "0", id); err != nil {
			t.Fatal(err)
		}
		waitAllDead(t, tree, 5*time.Second)
		if st := e.State(t, id); st != "running" {
			t.Fatalf("restart %d: container is %s", i, st)
		}
	}
}

// startForeign starts a shell in its own process group that runs kcserver
// by hand (the shape of Positron's supervisor-wrapper.sh) next to a
// process carrying the container ID: the shell, neither anchor nor
// supervisor, leads the group.
func startForeign(t *testing.T, id string) []fingerprint.Stat {
	t.Helper()
	bin := testutil.BuildKCServer(t)
	cmd := exec.Command("sh", "-c", `"$0" --transport socket --socket-dir "$1" & sh -c 'sleep 1000000; :' anchor "$2" & wait`, bin, t.TempDir(), id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		killGroup(group(t, pgid))
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms := group(t, pgid)
		if len(ms) == 4 && slices.ContainsFunc(ms, func(m fingerprint.Stat) bool { return m.Comm == "kcserver" }) {
			return ms // sh, kcserver, the anchor sh and its sleep
		}
		if time.Now().After(deadline) {
			t.Fatalf("foreign group %d never got its kcserver", pgid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHookAfterContainerDiesByItself: when the container's init dies
// without `podman stop` (killed, or exiting), conmon runs podman's cleanup,
// which runs the poststop hook — from conmon's process group, whose members
// carry the container ID. The hook must reap the tree and nothing of its
// own group.
func TestHookAfterContainerDiesByItself(t *testing.T) {
	e := podmantest.New(t)
	state := t.TempDir()
	installHook(t, e, state)
	id := e.Run(t)
	_, tree := startTree(t, t.TempDir(), id, testutil.Fake{})

	if _, err := e.Podman("kill", "-s", "KILL", id); err != nil {
		t.Fatal(err)
	}
	waitAllDead(t, tree, 20*time.Second)

	store, err := ledger.OpenReadOnly(state)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := store.Load(id)
		if err == nil && rec.Outcome == "reaped" {
			for _, tr := range rec.Trees {
				if tr.Action != "reaped" && tr.Action != "gone" {
					t.Errorf("tree %d recorded as %q (%s)", tr.PGID, tr.Action, tr.Error)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reaped outcome recorded: %+v, %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(state + "/kc-hook.log")
	if strings.Contains(string(log), "own process group") {
		t.Logf("the hook ran inside a group that looked like a tree (and left it alone):\n%s", log)
	}
}
