package hook

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// startOtherUsersTree starts the fake supervisor as uid 65534, carrying id,
// the way another user's tree for a container of the same ID would run
// next to this user's. It is killed by PID at cleanup.
func startOtherUsersTree(t *testing.T, id string) fingerprint.Stat {
	t.Helper()
	dir := testutil.OpenTempDir(t, "kc-other-", 0o777)
	copyExec := func(src, name string) string {
		p := filepath.Join(dir, name)
		if err := testutil.CopyNew(src, p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bin := copyExec(testutil.BuildKCServer(t), "kcserver")
	hook := copyExec(testutil.Build(t, testutil.KCHookPackage, "kc-hook"), "kc-hook")
	init := exec.Command("sleep", "1000000")
	if err := init.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.Process.Kill(); init.Wait() })
	initSt, err := fingerprint.ReadStat("/proc", init.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready")
	// The supervise wrapper leads the group and carries the ID (the fake,
	// like kcserver, has none), as kc-hook launches a supervisor.
	cmd := exec.Command(hook, "supervise", "--state-dir=", "--max-restarts=0", id, strconv.Itoa(initSt.PID), strconv.FormatUint(initSt.StartTicks, 10),
		"--", bin, "--transport=socket", "--socket-dir="+dir)
	cmd.Env = append(os.Environ(), "KCFAKE_READY_FILE="+ready, "KCFAKE_CHILDREN=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: testutil.NobodyCredential()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(ready); err == nil && strings.Contains(string(b), "\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other user's fake supervisor did not become ready")
		}
	}
	st, err := fingerprint.ReadStat("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPoststopAsRootlessUser runs Poststop as a rootless podman runs the
// hook: root of a user namespace that maps UID 0 to host UID 1001 and
// leaves everyone else unmapped (the overflow UID). The user's own tree
// (UID 0 here) is reaped and recorded with host UID 1001; another user's
// tree carrying the same container ID is neither signalled nor recorded.
func TestPoststopAsRootlessUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the other user's tree runs as uid 65534")
	}
	id := strings.Repeat("ab", 32)
	mineK := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Children: 1, IgnoreTerm: true})
	other := startOtherUsersTree(t, id)

	// Both are trees of this container as far as /proc can tell.
	found, _, err := trees.Scan(trees.Options{Root: "/proc", Comms: []string{"kcserver"}, Only: map[string]bool{id: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 {
		out, _ := exec.Command("ps", "-eo", "pid,pgid,sid,uid,comm,args").Output()
		t.Logf("other %+v\n%s", other, out)
		t.Fatalf("scan found %d trees of the container, want the user's and the other user's: %+v", len(found), found)
	}

	tr := userns.Translator{Map: userns.Map{{Inside: 0, Outside: 1001, Count: 1}, {Inside: 1, Outside: 100000, Count: 65536}}, Overflow: 65534}
	stateDir := t.TempDir()
	cfg := Config{
		StateDir:  stateDir,
		Comms:     []string{"kcserver"},
		KillGrace: 200 * time.Millisecond,
		Deadline:  10 * time.Second,
		Logger:    slog.New(slog.NewJSONHandler(io.Discard, nil)),
		UIDs:      &tr,
	}
	res, err := Poststop(context.Background(), cfg, &specs.State{ID: id, Status: specs.StateStopped})
	if err != nil || res.Failed {
		t.Fatalf("Poststop = %+v, %v", res, err)
	}
	if len(res.Trees) != 1 || res.Trees[0].PGID != mineK.PGID {
		t.Fatalf("trees = %+v, want only the user's own (pgid %d)", res.Trees, mineK.PGID)
	}
	if got := res.Trees[0]; got.Action != action.Reaped || got.UID != 1001 {
		t.Errorf("the user's tree: action %q uid %d, want %q and host uid 1001", got.Action, got.UID, action.Reaped)
	}
	mineK.Wait(t)

	st, err := fingerprint.ReadStat("/proc", other.PID)
	if err != nil || !fingerprint.Same(st, other) || st.Zombie() {
		t.Fatalf("the other user's tree was harmed: %+v, %v", st, err)
	}
	store, err := ledger.OpenReadOnly(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != string(action.Reaped) || len(rec.Trees) != 1 || rec.Trees[0].UID != 1001 {
		t.Errorf("record: outcome %q, trees %+v; want reaped, one tree of host uid 1001", rec.Outcome, rec.Trees)
	}
}
