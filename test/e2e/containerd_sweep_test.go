package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestSweepContainerd: sweep and cull inside a containerd container
// (ctr run, no Docker, no Kubernetes) addressed by a 12-character ID
// prefix that containerd resolves to the task's PID: two supervisors, one
// SIGKILLed inside the container; the dead one's sockets are stale and
// only they are unlinked with --apply; cull audits the live one.
func TestSweepContainerd(t *testing.T) {
	addr := containerdtest.Address(t)
	const ns = "kc-e2e-sweep"
	kcserver := testutil.BuildKCServer(t)
	id := hexID(t)
	initPID := containerdtest.Run(t, addr, ns, id,
		[]string{"--mount", "type=bind,src=" + kcserver + ",dst=/kcserver,options=rbind:ro", "--env", "KCFAKE_OPEN_CHANNELS=1"},
		"/bin/sh", "-c", "KCFAKE_READY_FILE=/tmp/ready-a /kcserver --transport=socket --socket-dir=/tmp & "+
			"KCFAKE_READY_FILE=/tmp/ready-b /kcserver --transport=socket --socket-dir=/tmp & wait")
	root := fmt.Sprintf("/proc/%d/root", initPID)
	dead, live := readyPID(t, root+"/tmp/ready-a"), readyPID(t, root+"/tmp/ready-b")
	sock := func(pid int, session bool) string {
		if session {
			return fmt.Sprintf("%s/tmp/kc-%d.python-0.sock", root, pid)
		}
		return fmt.Sprintf("%s/tmp/kc-%d.sock", root, pid)
	}
	containerdtest.Ctr(t, addr, ns, "tasks", "exec", "--exec-id", "kc-kill", id, "/bin/kill", "-KILL", strconv.Itoa(dead))
	proc.WaitFor(t, 10*time.Second, "the killed supervisor reaped in the container", func() bool {
		_, err := os.Stat(fmt.Sprintf("%s/proc/%d", root, dead))
		return os.IsNotExist(err)
	})

	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.HasPrefix(k, "KC_") || k == "DOCKER_HOST" || k == "CONTAINER_HOST" || k == "CONTAINERD_ADDRESS"
	})
	env = append(env, "KC_ENGINE=containerd", "KC_CONTAINERD_ADDRESS="+addr)
	prefix := id[:12]
	want := map[string]string{
		sock(dead, false): "stale", sock(dead, true): "stale",
		sock(live, false): "live", sock(live, true): "live",
	}
	for _, apply := range []bool{false, true} {
		args := []string{"sweep", "--container", prefix, "--format", "json", "--timeout", "500ms"}
		if apply {
			args = append(args, "--apply")
		}
		rep := sweepJSON(t, env, args...)
		if rep.DryRun == apply || len(rep.Sockets) != len(want) {
			t.Errorf("apply %v: dry run %v, %d sockets, want %d: %+v", apply, rep.DryRun, len(rep.Sockets), len(want), rep.Sockets)
		}
		for _, s := range rep.Sockets {
			if w := want[s.Path]; s.Verdict != w {
				t.Errorf("%s: %s (%s), want %q", s.Path, s.Verdict, s.Reason, w)
			}
		}
	}
	for p, w := range want {
		_, err := os.Lstat(p)
		switch {
		case w == "stale" && err == nil:
			t.Errorf("stale %s was not unlinked", p)
		case w == "live" && err != nil:
			t.Errorf("live %s: %v", p, err)
		}
	}

	out, errOut, code := janitor(t, env, "cull", "--container", prefix, "--format", "json")
	var cr cullReport
	if err := json.Unmarshal([]byte(out), &cr); err != nil || code != 0 {
		t.Fatalf("cull exit %d: %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	if len(cr.Supervisors) != 1 || cr.Supervisors[0].Socket != sock(live, false) || len(cr.Supervisors[0].Candidates) != 1 {
		t.Errorf("cull: %s", out)
	}
}
