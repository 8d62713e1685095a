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
// PID 1 of a PID namespace of its own. A process of neither (a PID
// reused since the engine answered) is refused, and its sockets are not
// looked for.
func TestContainerTargetIsTheInit(t *testing.T) {
	id := testutil.RandomHex(t, 64)
	host := proc.Sleep(t, nil)

	cg := testutil.MakeCgroup(t, "machine", "libpod-"+id+".scope")
	inCgroup := proc.Sleep(t, nil)
	if err := os.WriteFile(filepath.Join(cg.Dir, "cgroup.procs"), []byte(strconv.Itoa(inCgroup.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}

	nsInit := proc.NamespaceInit(t)

	for _, tc := range []struct {
		name string
		pid  int
		want string // "" for taken
	}{
		{"a host process in no cgroup of the container", host.Process.Pid, "is not"},
		{"in a cgroup named after the container", inCgroup.Process.Pid, ""},
		{"PID 1 of a PID namespace of its own", nsInit, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerTargetIn(fingerprint.DefaultRoot, "c", engine.Match{Engine: "podman", ID: id, InitPID: tc.pid})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && (got.InitPID != tc.pid || got.StartTicks != proc.MustStat(t, fingerprint.DefaultRoot, tc.pid).StartTicks):
				t.Errorf("target %+v, want pid %d held by its start", got, tc.pid)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("target %+v, err %v: want an error saying %q", got, err, tc.want)
			}
		})
	}
}
