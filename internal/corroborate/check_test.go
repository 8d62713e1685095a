package corroborate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	if err := testutil.CopyFile("/bin/sh", bin, 0o755); err != nil {
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

// TestOtherUsersChildren: a monitor's child of a UID neither root's nor
// the tree's is evidence only under root's monitor (a rootful container
// run as a third UID); under a monitor of that user's own (which he may
// start, named and placed as he likes) it is none.
func TestOtherUsersChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as another UID and place them in a cgroup")
	}
	const id = "5555555555555555555555555555555555555555555555555555555555555555"
	dir := testutil.OpenTempDir(t, "kc-monitor-", 0o755)
	bin := filepath.Join(dir, "conmon")
	if err := testutil.CopyNew("/bin/sh", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		monitorAs *syscall.Credential // nil: root
		child     string
		want      bool
	}{
		// The child drops to nobody itself: root's monitor's child of
		// another UID.
		{"under root's monitor", nil, "setpriv --reuid 65534 --regid 65534 --clear-groups sleep 1000", true},
		{"under the user's own monitor", testutil.NobodyCredential(), "sleep 1000", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := testutil.MakeCgroup(t, "default", id)
			cmd := exec.Command(bin, "-c", tc.child+" & wait", "conmon", "-c", id)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: tc.monitorAs}
			proc.StartGroup(t, cmd)
			mon, child := cmd.Process.Pid, 0
			proc.WaitFor(t, 10*time.Second, "the monitor's child to run as nobody", func() bool {
				for _, pid := range proc.GroupMembers(mon) {
					if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); pid != mon && err == nil && strings.Contains(string(st), "Name:\tsleep\n") && strings.Contains(string(st), "\nUid:\t65534\t") {
						child = pid
						return true
					}
				}
				return false
			})
			// Root places it, as a runtime would: a user cannot move a
			// process into a cgroup he was not delegated.
			if err := os.WriteFile(filepath.Join(cg.Dir, "cgroup.procs"), []byte(fmt.Sprint(child)), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, l := range []proctable.Lister{proctable.ListAuto, proctable.ListProc} {
				snap, err := proctable.List(proctable.Options{Lister: l, Watch: Watch})
				if err != nil {
					t.Fatal(err)
				}
				for _, uid := range []int{0, 1001} {
					ev, running, err := New("", snap, nil, "").Check(Query{ID: id, UID: uid})
					if err != nil {
						t.Fatal(err)
					}
					if running != tc.want {
						t.Errorf("--bpf %s, a tree of UID %d: running %v (%v), want %v", l, uid, running, ev, tc.want)
					}
				}
			}
		})
	}
}
