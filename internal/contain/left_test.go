package contain

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestSweepSparesWhatLeftBeforeItWasJudged: a PID the sweep listed whose
// process is outside the cgroup by the time it is read (the listed one
// exited and its PID went to a host process, or it was moved out) is not
// killed: neither by cgroup.kill nor through its pidfd. The fake /proc's
// status file of the leaver is a FIFO, so the test moves it out exactly
// while the sweep reads it; the member that stays is killed.
func TestSweepSparesWhatLeftBeforeItWasJudged(t *testing.T) {
	c := contained(t, KindCgroup2)
	stays := startIn(t, c, "sleep", "1000000")
	leaves := startIn(t, c, "sleep", "1000001")
	out := filepath.Join(c.Mount, filepath.Dir(c.Path), "kc-test-left-"+testutil.RandomHex(t, 8))
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		leaves.Process.Kill()
		if !within(5*time.Second, func() bool { return unix.Rmdir(out) == nil }) {
			t.Errorf("cannot remove %s", out)
		}
	})
	root := t.TempDir()
	fakeProcOf(t, root, stays.Process.Pid, nil)
	fakeProcOf(t, root, leaves.Process.Pid, map[string]func(string){"status": func(string) {}})
	fifo := filepath.Join(root, strconv.Itoa(leaves.Process.Pid), "status")
	wait := testutil.OnFIFORead(t, fifo, func(w *os.File) error {
		pid := strconv.Itoa(leaves.Process.Pid)
		if err := os.WriteFile(filepath.Join(out, "cgroup.procs"), []byte(pid), 0); err != nil {
			return err
		}
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			return err
		}
		// Later reads (a pin's) find a plain file where the FIFO was.
		plain := fifo + ".plain"
		if err := os.WriteFile(plain, status, 0o644); err != nil {
			return err
		}
		if err := os.Rename(plain, fifo); err != nil {
			return err
		}
		_, err = w.Write(status)
		return err
	})

	res := Sweep(context.Background(), c, SweepOptions{Root: root, KillWait: 2 * time.Second})
	wait()
	if slices.ContainsFunc(res.Killed, func(s fingerprint.Stat) bool { return s.PID == leaves.Process.Pid }) {
		t.Errorf("killed %+v: the leaver is among them", res.Killed)
	}
	if !spared(leaves.Process.Pid) {
		t.Fatalf("the process that left the cgroup before it was judged was killed (sweep %+v)", res)
	}
	if !exits(stays, 5*time.Second) {
		t.Errorf("the member that stayed lives (sweep %+v)", res)
	}
}
