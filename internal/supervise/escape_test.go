package supervise_test

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/supervise/supervisetest"
	"github.com/kc-watchman/kc-watchman/internal/testkit"
)

// TestEscapedDescendantsDieWithInit: a supervised kcserver starts a child
// in a session of its own and a double-forked daemon; both die when the
// container's init (a stand-in) dies. The daemon is orphaned before the
// fake is even ready: only the wrapper, as child subreaper, still has it
// below itself (DESIGN §16). An unrelated process of the same UID in a
// session of its own lives. Before the subreaper and the descendant walk,
// both lived on under PID 1 (issue 30).
func TestEscapedDescendantsDieWithInit(t *testing.T) {
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	bystanderCmd := exec.Command("sleep", "1000000")
	bystanderCmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := bystanderCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystanderCmd.Process.Kill(); bystanderCmd.Wait() })
	bystander, err := fingerprint.ReadStat(fingerprint.DefaultRoot, bystanderCmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	k := testkit.StartKCServer(t, t.TempDir(), testkit.Fake{ContainerID: cid, InitPID: init.PID, SetsidChild: true, DaemonChild: true})
	wrapper := k.Cmd.Process.Pid
	if k.Daemon.PID == 0 || k.Daemon.PPID != wrapper {
		t.Fatalf("the daemon %+v was not adopted by the wrapper %d", k.Daemon, wrapper)
	}
	var setsid fingerprint.Stat
	for _, c := range k.Children {
		if c.PGID == c.PID {
			setsid = c
		}
	}
	if setsid.PID == 0 {
		t.Fatalf("no setsid child among %+v", k.Children)
	}

	if err := initCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	k.Wait(t)
	escaped := []fingerprint.Stat{setsid, k.Daemon}
	supervisetest.Eventually(t, 10*time.Second, "escaped descendants alive after init died", func() bool { return allDead(escaped) })
	if !fingerprint.Alive(fingerprint.DefaultRoot, bystander) {
		t.Error("an unrelated process of the same UID was killed")
	}
	if code := k.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("wrapper exit code %d, want 0: %s", code, k.Stderr())
	}
}
