package corroborate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestTreeIsNoEvidence: a monitor's child in the container's cgroup is
// no evidence when it is a member of the tree judged, or descends from
// one (a supervisor wrapper adopted by the monitor, a tree that started
// the monitor).
func TestTreeIsNoEvidence(t *testing.T) {
	const id = "4444444444444444444444444444444444444444444444444444444444444444"
	cg := testutil.MakeCgroup(t, "default", id)
	bin := filepath.Join(t.TempDir(), "conmon")
	data, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", `sh -c 'echo 0 > "$0/cgroup.procs" && exec sleep 1000' "$CG" & wait`, "conmon", "-c", id)
	cmd.Env = append(os.Environ(), "CG="+cg.Dir)
	proc.StartGroup(t, cmd)
	mon, child := cmd.Process.Pid, 0
	proc.WaitFor(t, 10*time.Second, "the monitor's child in the container's cgroup", func() bool {
		for _, pid := range proc.GroupMembers(mon) {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if pid != mon && err == nil && strings.Contains(string(data), "::"+cg.Path+"\n") {
				child = pid
				return true
			}
		}
		return false
	})
	for _, l := range []proctable.Lister{proctable.ListAuto, proctable.ListProc} {
		snap, err := proctable.List(proctable.Options{Lister: l, Watch: Watch})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name    string
			members []int
			want    bool
		}{
			{"not the tree's", nil, true},
			{"a member", []int{child}, false},
			{"a descendant of a member", []int{mon}, false},
		} {
			ev, running, err := New("", snap, nil, "").Check(Query{ID: id, UID: 0, Members: c.members})
			if err != nil {
				t.Fatal(err)
			}
			if running != c.want {
				t.Errorf("--bpf %s: %s: running %v (%v), want %v", l, c.name, running, ev, c.want)
			}
		}
	}
}
