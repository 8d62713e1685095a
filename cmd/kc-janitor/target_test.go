package main

import (
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
