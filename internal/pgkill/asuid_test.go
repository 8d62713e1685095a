package pgkill

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestSignalsGoOutAsTheUIDChecked: a pidfd signal is sent as the UID the
// target was checked to run as, so a process that took root's UID after
// the check (a setuid program it ran) gets nothing: the kernel refuses
// it. The check's read is a fake /proc's status that still shows the old
// UID; the target really runs as root.
func TestSignalsGoOutAsTheUIDChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root sends as another UID")
	}
	const nobody = 65534
	senders := []struct {
		name string
		send func(root string, m fingerprint.Stat, uids []int, sig syscall.Signal) error
	}{
		{"pinned (escaped members, cgroup sweeps)", signalPinned},
		{"group member", func(root string, m fingerprint.Stat, uids []int, sig syscall.Signal) error {
			return signalMember(root, m, []int{m.PGID}, uids, sig)
		}},
	}
	for _, s := range senders {
		t.Run(s.name, func(t *testing.T) {
			t.Run("root now, nobody when checked", func(t *testing.T) {
				inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setsid: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(inn.Close)
				root := fakeUIDs(t, inn.PID, nobody)
				before, err := inn.Sync()
				if err != nil {
					t.Fatal(err)
				}
				if err := s.send(root, inn.Stat, []int{nobody}, syscall.SIGUSR1); err == nil {
					t.Error("sent to a root process as if it were nobody's")
				}
				// A signal, had it gone out, was queued before the call
				// returned; the sync after it sees it.
				if got := caughtAtLeast(t, inn, before) - before; got != 0 {
					t.Errorf("the root process caught %d signals (%v), want none", got, inn.Caught())
				}
			})
			t.Run("nobody when checked and now (control)", func(t *testing.T) {
				cmd := exec.Command("sleep", "1000000")
				cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: testutil.NobodyCredential()}
				proc.Start(t, cmd)
				done := make(chan struct{})
				go func() { cmd.Wait(); close(done) }()
				st := proc.MustStat(t, fingerprint.DefaultRoot, cmd.Process.Pid)
				if err := s.send(fingerprint.DefaultRoot, st, []int{nobody}, syscall.SIGKILL); err != nil {
					t.Fatalf("not sent to nobody's process as nobody: %v", err)
				}
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Error("nobody's process lives")
				}
			})
		})
	}
}

// fakeUIDs is a fake /proc holding pid's stat and cmdline as they are
// and its status with every UID uid.
func fakeUIDs(t *testing.T, pid, uid int) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"stat", "cmdline"} {
		if err := testutil.CopyFile(filepath.Join("/proc", strconv.Itoa(pid), name), filepath.Join(dir, name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	u := strconv.Itoa(uid)
	status = regexp.MustCompile(`(?m)^Uid:.*$`).ReplaceAll(status, []byte("Uid:\t"+u+"\t"+u+"\t"+u+"\t"+u))
	if err := os.WriteFile(filepath.Join(dir, "status"), status, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestPinnedStopGoesOutAsTheTreesUID: the stop that holds a group's
// pinned member while the group is checked goes out as the tree's UID,
// like the group's signal: a member whose (fake) status still showed the
// tree's UID at the check but which runs as root now is neither stopped
// (a stop shows as a caught SIGCONT once undone) nor signalled.
func TestPinnedStopGoesOutAsTheTreesUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root sends as another UID")
	}
	const nobody = 65534
	inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	root := fakeUIDs(t, inn.PID, nobody)
	pin, err := fingerprint.Pin(root, inn.Stat)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	before, err := inn.Sync()
	if err != nil {
		t.Fatal(err)
	}
	if err := signalWhilePinned(root, inn.Stat.PGID, pin, syscall.SIGUSR1, func() error { return nil }, nobody); err == nil {
		t.Error("signalled a root process's group as nobody's")
	}
	if got := caughtAtLeast(t, inn, before) - before; got != 0 {
		t.Errorf("the root process caught %d signals (%v), want none: stopped and continued, or signalled", got, inn.Caught())
	}
}
