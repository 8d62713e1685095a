package supervise_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// TestEscapedDescendantsDieWithInit: a supervised kcserver starts a child
// in a session of its own and a double-forked daemon; both die when the
// container's init (a stand-in) dies. The daemon is orphaned before the
// fake is even ready: only the wrapper, as child subreaper, still has it
// below itself (DESIGN "Descendants that leave the group"). An unrelated process of the same UID in a
// session of its own lives. Before the subreaper and the descendant walk,
// both lived on under PID 1 (issue 30).
func TestEscapedDescendantsDieWithInit(t *testing.T) {
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	bystander := testutil.StartSleep(t, &syscall.SysProcAttr{Setsid: true}, "1000000")

	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: cid, InitPID: init.PID, SetsidChild: true, DaemonChild: true})
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

// TestTeardownSparesOthers: the wrapper's teardown signals only what the
// member rules allow, among its command's children in sessions of their
// own (escaped) and those left in the group alike: another UID's (it ran
// setpriv) and one carrying another container's ID live, the wrapper
// logs them, and so does everything below them; the plain one dies.
func TestTeardownSparesOthers(t *testing.T) {
	other := strings.Repeat("c", 64)
	for _, tc := range []struct {
		name, prefix string
		inGroup      bool   // the children stay in the wrapper's group
		said         string // the log line naming the spared
	}{
		{"escaped descendants", "setsid ", false, "descendant not signalled"},
		{"group members", "", true, "group member not signalled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			initCmd, init := supervisetest.Process(t, "sleep", "1000000")
			script := tc.prefix + `sleep 1000000 & ` +
				tc.prefix + `setpriv --reuid=65534 --regid=65534 --clear-groups sleep 1000001 & ` +
				tc.prefix + `bash -c 'exec -a --container-id=` + other + ` sleep 1000002' & wait`
			w := startWrapper(t, init, []string{"--kill-grace=2s"}, "bash", "-c", script)

			var mine, otherUID, otherCtnr fingerprint.Stat
			supervisetest.Eventually(t, 10*time.Second, "the command's three children", func() bool {
				mine, otherUID, otherCtnr = fingerprint.Stat{}, fingerprint.Stat{}, fingerprint.Stat{}
				var bash []int
				for _, c := range trees.Children(fingerprint.DefaultRoot, w.st.PID) {
					bash = append(bash, trees.Children(fingerprint.DefaultRoot, c)...)
				}
				for _, pid := range bash {
					id, err := fingerprint.Read(fingerprint.DefaultRoot, pid)
					// A child between fork and exec has no argv yet.
					if err != nil || (id.PGID != id.PID) != tc.inGroup || id.Comm != "sleep" || len(id.Argv) == 0 {
						continue
					}
					switch {
					case strings.HasPrefix(id.Argv[0], "--container-id="):
						otherCtnr = id.Stat
					case id.UID == 65534:
						otherUID = id.Stat
					case id.Argv[len(id.Argv)-1] == "1000000":
						mine = id.Stat
					}
				}
				return mine.PID != 0 && otherUID.PID != 0 && otherCtnr.PID != 0
			})
			t.Cleanup(func() {
				for _, s := range []fingerprint.Stat{mine, otherUID, otherCtnr} {
					supervisetest.KillProcess(s)
				}
			})

			if err := initCmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			w.exitCode(t, 15*time.Second)
			supervisetest.Eventually(t, 10*time.Second, "the wrapper's own child dead", func() bool { return allDead([]fingerprint.Stat{mine}) })
			for _, s := range []fingerprint.Stat{otherUID, otherCtnr} {
				if !fingerprint.Alive(fingerprint.DefaultRoot, s) {
					t.Errorf("%d (uid or container not the tree's) was killed", s.PID)
				}
			}
			if log := w.logText(); !strings.Contains(log, tc.said) {
				t.Errorf("the spared were not reported:\n%s", log)
			}
		})
	}
}

// TestTeardownStopsACommandRunAsAnotherUser: an allowlist entry may start
// its command through setpriv, so that the supervisor does not run as
// root. The command and its kernels then run as that user, not as the
// wrapper: they are the wrapper's tree all the same, and die with the
// container.
func TestTeardownStopsACommandRunAsAnotherUser(t *testing.T) {
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	w := startWrapper(t, init, []string{"--kill-grace=2s"},
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "setsid sleep 1000004 & sleep 1000003 & wait")
	var members []fingerprint.Stat
	supervisetest.Eventually(t, 10*time.Second, "the command, its child and its setsid child, as uid 65534", func() bool {
		members = nil
		for _, c := range trees.Children(fingerprint.DefaultRoot, w.st.PID) {
			for _, pid := range append([]int{c}, trees.Children(fingerprint.DefaultRoot, c)...) {
				id, err := fingerprint.Read(fingerprint.DefaultRoot, pid)
				if err == nil && id.UID == 65534 && (id.Comm == "sh" || id.Comm == "sleep") {
					members = append(members, id.Stat)
				}
			}
		}
		return len(members) == 3
	})
	t.Cleanup(func() {
		for _, s := range members {
			supervisetest.KillProcess(s)
		}
	})
	if err := initCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	w.exitCode(t, 15*time.Second)
	supervisetest.Eventually(t, 10*time.Second, "the command and its children dead, the setsid one too", func() bool { return allDead(members) })
}
