package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestContainerTargetIsTheInit: the PID an engine gives for a running
// container's init is taken as the sweep's target only if the process
// holding it may be that init: in a cgroup named after the container, or
// PID 1 of a PID namespace of its own under a container monitor, in no
// other container's cgroup. Anything else (a PID reused since the engine
// answered) is refused, and its sockets are not looked for.
func TestContainerTargetIsTheInit(t *testing.T) {
	id, other := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	// inCgroup makes a cgroup named as podman names container named's
	// (before the process: cleanups run in reverse, and the cgroup
	// goes once its process has) and returns what moves a process in.
	inCgroup := func(t *testing.T, named string) func(pid int) {
		cg := testutil.MakeCgroup(t, "machine", "libpod-"+named+".scope")
		return func(pid int) {
			if err := os.WriteFile(filepath.Join(cg.Dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) int
		want  string // "" for taken
	}{
		{"a host process", func(t *testing.T) int { return proc.Sleep(t, nil).Process.Pid }, "may not be its"},
		{"in a cgroup named after the container", func(t *testing.T) int {
			move := inCgroup(t, id)
			pid := proc.Sleep(t, nil).Process.Pid
			move(pid)
			return pid
		}, ""},
		{"PID 1 of a PID namespace under a container monitor", func(t *testing.T) int { return proc.NamespaceInit(t, "conmon") }, ""},
		{"PID 1 of a PID namespace a user made", func(t *testing.T) int { return proc.NamespaceInit(t, "") }, "no container monitor"},
		{"PID 1 under a monitor, in another container's cgroup", func(t *testing.T) int {
			move := inCgroup(t, other)
			pid := proc.NamespaceInit(t, "conmon")
			move(pid)
			return pid
		}, "another container's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := tc.start(t)
			got, err := containerTargetIn(fingerprint.DefaultRoot, "c", engine.Match{Engine: "podman", ID: id, InitPID: pid})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && (got.InitPID != pid || got.StartTicks != proc.MustStat(t, fingerprint.DefaultRoot, pid).StartTicks):
				t.Errorf("target %+v, want pid %d held by its start", got, pid)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("target %+v, err %v: want an error saying %q", got, err, tc.want)
			}
		})
	}
}

// TestContainerTargetRecycledBetweenReads: the check that the engine's
// PID may be the init is of one process only if that PID still names the
// process whose start time was read first. The fake /proc's cgroup file
// is a FIFO, so the test gets control exactly while the check reads it
// and can put another process (another start time) behind the PID then.
func TestContainerTargetRecycledBetweenReads(t *testing.T) {
	const pid = 4242
	id := testutil.RandomHex(t, 64)
	stat := func(start int) []byte {
		return []byte(fmt.Sprintf("%d (sleep) S 1 %d %d 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, pid, pid, start))
	}
	for _, tc := range []struct {
		name    string
		recycle bool
	}{
		{"the same process throughout", false},
		{"another process behind the PID by the second read", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, strconv.Itoa(pid))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "stat"), stat(100), 0o644); err != nil {
				t.Fatal(err)
			}
			wait := testutil.OnFIFORead(t, filepath.Join(dir, "cgroup"), func(w *os.File) error {
				if tc.recycle {
					if err := os.WriteFile(filepath.Join(dir, "stat"), stat(200), 0o644); err != nil {
						return err
					}
				}
				_, err := fmt.Fprintf(w, "0::/machine.slice/libpod-%s.scope\n", id)
				return err
			})
			got, err := containerTargetIn(root, "c", engine.Match{Engine: "podman", ID: id, InitPID: pid})
			wait()
			switch {
			case tc.recycle && err == nil:
				t.Fatalf("took %+v: the check was of another process than the one held", got)
			case tc.recycle && !strings.Contains(err.Error(), "is gone"):
				t.Errorf("err %v: want it to say the init is gone", err)
			case !tc.recycle && (err != nil || got.InitPID != pid || got.StartTicks != 100):
				t.Errorf("target %+v, err %v: want pid %d held by start 100", got, err, pid)
			}
		})
	}
}
