//go:build reliability

package reliability

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// containLoop: each generation starts the next in a session of its own
// and exits at once, ignoring SIGTERM; every 25th leaves a kernel (the
// script again, sleeping) behind. Bounded, so a failure does not leave
// it running for ever.
const containLoop = `trap '' TERM
[ "$1" = kernel ] && while :; do sleep 1; done
n=$1
[ "$n" -lt 20000 ] || exit 0
[ $((n % 25)) -eq 0 ] && setsid /bin/sh "$0" kernel &
setsid /bin/sh "$0" $((n+1)) &
`

// TestContainedForkLoops: a fork loop of new sessions racing the sweep
// of its cgroup (DESIGN "Descendants that leave the group"), on cgroup
// v2 and on the v1 freezer. Every other trial, a process of another UID
// is moved into the cgroup: it must live, unsignalled, and the others
// die through their pidfds instead of cgroup.kill. A same-UID process
// outside lives.
func TestContainedForkLoops(t *testing.T) {
	const trials = 8
	var swept, survivors, innocentsKilled, removed, withheldOK int
	var worst time.Duration
	for _, kind := range []contain.Kind{contain.KindCgroup2, contain.KindFreezer} {
		h := contain.Detect(contain.Options{Force: kind})
		if h.Kind != kind {
			t.Logf("no %s here: %s", kind, h.Why)
			continue
		}
		for i := range trials {
			other := i%2 == 1
			t.Run(string(kind)+"-"+strconv.Itoa(i), func(t *testing.T) {
				d, res, left, innocents := containTrial(t, h, other)
				swept++
				survivors += left
				innocentsKilled += innocents
				worst = max(worst, d)
				switch {
				case !other && res.Removed && res.Outcome == action.Reaped:
					removed++
				case other && len(res.Withheld) == 1 && res.Method == "pidfd" && !res.Removed:
					withheldOK++
				default:
					t.Errorf("sweep %+v (another UID inside: %v)", res, other)
				}
			})
		}
	}
	if swept == 0 {
		t.Skip("no cgroup containment on this host")
	}
	report(t, "contain", "fork_loops_swept", swept)
	report(t, "contain", "loop_processes_left", survivors)
	report(t, "contain", "innocents_killed", innocentsKilled)
	report(t, "contain", "cgroups_removed", removed)
	report(t, "contain", "other_uid_withheld", withheldOK)
	report(t, "contain", "slowest_sweep_ms", worst.Milliseconds())
}

// containTrial runs one loop in a fresh cgroup and sweeps it. It
// returns the sweep's duration and result, how many loop processes were
// left, and how many innocents (the bystander, the other UID's process)
// died.
func containTrial(t *testing.T, h contain.Host, otherUID bool) (time.Duration, contain.SweepResult, int, int) {
	id := newCID(t)
	cg, err := contain.Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close(); testutil.RemoveContainCgroups(t, id) })
	dir := filepath.Join(h.Mount, cg.Path)
	script := filepath.Join(t.TempDir(), "loop.sh")
	if err := os.WriteFile(script, []byte(containLoop), 0o644); err != nil {
		t.Fatal(err)
	}
	bystander := exec.Command("sleep", "1000000")
	bystander.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })
	var other *exec.Cmd
	if otherUID {
		other = exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000001")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	}

	// Held on stdin until it is inside (the v1 freezer moves it in
	// after start).
	cmd := exec.Command("/bin/sh", "-c", `read _; exec /bin/sh "$0" 0`, script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if fd, ok := cg.CloneFD(); ok {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := cg.Enter(context.Background(), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "\n")
	in.Close()
	waitProcs := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for len(procsOf(dir)) < n {
			if time.Now().After(deadline) {
				t.Fatalf("the loop did not get going: %v", procsOf(dir))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitProcs(4)
	if other != nil {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(other.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	res := contain.Sweep(context.Background(), cg, contain.SweepOptions{KillWait: 2 * time.Second})
	d := time.Since(start)
	left := len(loopProcs(script))
	time.Sleep(100 * time.Millisecond) // a loop that got away shows here
	left = max(left, len(loopProcs(script)))
	innocents := 0
	if proc.Dead(bystander.Process.Pid) {
		innocents++
	}
	if other != nil && proc.Dead(other.Process.Pid) {
		innocents++
	}
	return d, res, left, innocents
}

func procsOf(dir string) []string {
	data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return strings.Fields(string(data))
}

// loopProcs lists the live processes running script.
func loopProcs(script string) []int {
	ents, _ := os.ReadDir(procRoot)
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		id, err := fingerprint.Read(procRoot, pid)
		if err == nil && !id.Zombie() && strings.Contains(strings.Join(id.Argv, " "), script) {
			out = append(out, pid)
		}
	}
	return out
}
