package hook

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/contained"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// TestPoststopSaysWhatItLeaves: a tree of the dead container that reap
// refuses (here of no single UID: a member runs as another user) is left
// alive, and said: Refused names it, for kc-hook to exit 1 with.
func TestPoststopSaysWhatItLeaves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a member of another UID")
	}
	const id = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
	bin := filepath.Join(t.TempDir(), "kcserver")
	if err := testutil.CopyFile("/bin/sh", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	leader := exec.Command(bin, "-c", "sleep 1000000; :", id)
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := leader.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL); leader.Wait() })
	other := exec.Command("sleep", "1000000")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	proc.WaitFor(t, 5*time.Second, "the other user's member to exec sleep", func() bool {
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, other.Process.Pid)
		return err == nil && st.Comm == "sleep"
	})
	for _, tc := range []struct {
		name string
		uids *userns.Translator
	}{
		{"root's hook", nil},
		// A rootless user's hook: his tree of mixed UIDs is his to
		// report, not another user's to leave unsaid.
		{"a rootless user's hook", &userns.Translator{Map: userns.Map{{Inside: 0, Outside: 1001, Count: 1}, {Inside: 1, Outside: 100000, Count: 65534}}, Overflow: 65535}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{StateDir: t.TempDir(), Comms: []string{"kcserver"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), UIDs: tc.uids}
			res, err := Poststop(context.Background(), cfg, &specs.State{ID: id, Status: specs.StateStopped})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Refused) != 1 || res.Refused[0].PGID != pgid || res.Refused[0].Action != action.SkipOtherUID {
				t.Fatalf("refused %+v (trees %+v); want the mixed group, skipped-other-uid", res.Refused, res.Trees)
			}
			if !fingerprint.Running(fingerprint.DefaultRoot, other.Process.Pid) {
				t.Error("the other user's process was killed")
			}
		})
	}
}

// TestPoststopLeavesAnotherContainersGroup: a group another container's
// supervisor leads is that container's, even with a member carrying the
// dead container's ID (ambiguous: never reaped); poststop reads it
// through its leader, leaves it alive and unreported, and still reaps
// the dead container's own tree. Its member in the dead container's
// supervisor cgroup (only root can put it there) is spared by the
// cgroup's sweep, as it was when the group was refused as ambiguous,
// and the cgroup's own process is not.
func TestPoststopLeavesAnotherContainersGroup(t *testing.T) {
	const comm = "kcsrv-byleader"
	dead, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	h := contain.Detect(contain.Options{})
	var inCgroup *exec.Cmd
	if h.Kind == contain.KindCgroup2 {
		inCgroup = contained.Sleep(t, h, dead)
	}
	theirs := testutil.StartMixedGroup(t, comm, other, dead)
	mine := testutil.StartMixedGroup(t, comm, dead, dead)
	if inCgroup != nil {
		procs := filepath.Join(h.Mount, contain.Dir, dead, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(theirs.Member)), 0); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{StateDir: t.TempDir(), Comms: []string{comm}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), KillGrace: time.Second}
	res, err := Poststop(context.Background(), cfg, &specs.State{ID: dead, Status: specs.StateStopped})
	if err != nil {
		t.Fatal(err)
	}
	if inCgroup != nil && fingerprint.Running(fingerprint.DefaultRoot, inCgroup.Process.Pid) {
		t.Errorf("the dead container's supervisor cgroup was not swept: %d lives", inCgroup.Process.Pid)
	}
	if len(res.Refused) != 0 || res.Failed {
		t.Errorf("refused %+v, failed %v: want the other container's group left unsaid", res.Refused, res.Failed)
	}
	var reaped bool
	for _, tr := range res.Trees {
		switch tr.PGID {
		case theirs.PGID:
			t.Errorf("the other container's group is among the dead one's trees: %+v", tr)
		case mine.PGID:
			reaped = tr.Action == action.Reaped
		}
	}
	if !reaped {
		t.Errorf("the dead container's own tree was not reaped: %+v", res.Trees)
	}
	for _, pid := range []int{theirs.PGID, theirs.Member} {
		if !fingerprint.Running(fingerprint.DefaultRoot, pid) {
			t.Errorf("process %d of the other container's group was killed", pid)
		}
	}
}
