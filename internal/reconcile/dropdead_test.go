package reconcile

import (
	"os/exec"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// TestDropDeadKeepsAnOccupiedGroup: a stray whose recorded members are
// all dead is left out of an apply run only once its group is empty; a
// process that joined the group since the scan keeps it for the kill,
// which looks for joiners.
func TestDropDeadKeepsAnOccupiedGroup(t *testing.T) {
	start := func(pgid int) *exec.Cmd {
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	stray := func(cmd *exec.Cmd) Tree {
		st, err := fingerprint.ReadStat("/proc", cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return Tree{PGID: cmd.Process.Pid, Action: action.WouldReap, Members: []Member{{PID: st.PID, StartTicks: st.StartTicks}}}
	}
	kill := func(cmd *exec.Cmd) {
		cmd.Process.Kill()
		cmd.Wait()
	}

	alone := start(0)
	gone := stray(alone)
	kill(alone)

	leader := start(0)
	joined := stray(leader)
	start(leader.Process.Pid) // joins after the scan
	kill(leader)

	got := dropDead(Options{}, []Tree{gone, joined})
	if len(got) != 1 || got[0].PGID != joined.PGID {
		t.Errorf("kept %+v; want only the group a process still occupies (%d)", got, joined.PGID)
	}
}
