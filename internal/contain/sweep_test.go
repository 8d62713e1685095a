package contain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// forkLoop: each generation starts the next in a session of its own and
// exits, so at any moment the loop is one or two fresh processes with no
// parent but PID 1; every 25th also leaves a "kernel" behind. Bounded, so
// a failing test does not leave it running for ever.
const forkLoop = `n=$1
[ "$n" -lt 200000 ] || exit 0
[ $((n % 25)) -eq 0 ] && setsid sleep 1000000 &
setsid /bin/sh "$0" $((n+1)) &
`

// contained prepares a cgroup of kind for a fresh container ID, removed
// when the test ends.
func contained(t *testing.T, kind Kind) *Cgroup {
	t.Helper()
	return containedAs(t, kind, os.Getuid())
}

// containedAs is contained for a tree of uid.
func containedAs(t *testing.T, kind Kind, uid int) *Cgroup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	h := Detect(Options{Force: kind})
	if h.Kind != kind {
		t.Skipf("no %s here: %s", kind, h.Why)
	}
	id := newID(t)
	c, err := Prepare(context.Background(), h, id, uid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		testutil.RemoveContainCgroups(t, id)
	})
	return c
}

// startIn starts argv in c the way the wrapper does: into it on cgroup
// v2, moved in right after start elsewhere (the command waits for a line
// on stdin, so nothing forks before it is inside).
func startIn(t *testing.T, c *Cgroup, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"-c", `read _; exec "$@"`, "sh"}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if fd, ok := c.CloneFD(); ok {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := c.Enter(context.Background(), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "\n")
	in.Close()
	return cmd
}

func cgroupProcs(t *testing.T, c *Cgroup) []int {
	data, err := os.ReadFile(filepath.Join(c.Mount, c.Path, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// exits reports whether cmd exits (and is reaped) within d.
func exits(cmd *exec.Cmd, d time.Duration) bool {
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// spared reports whether the test's unreaped child pid is still running a
// moment after a sweep: a SIGKILL sent to it takes effect within that
// (it is a zombie then, which signal 0 still reaches).
func spared(pid int) bool {
	return !within(200*time.Millisecond, func() bool { return proc.Dead(pid) })
}

func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// fakeProcOf lays out in root, a fake /proc, the files a sweep reads of
// the started sleep pid: as /proc has them, but for those in instead,
// whose functions lay out the file at the path they are given.
func fakeProcOf(t *testing.T, root string, pid int, instead map[string]func(path string)) {
	t.Helper()
	if !within(5*time.Second, func() bool {
		id, err := fingerprint.Read("/proc", pid)
		return err == nil && id.Comm == "sleep"
	}) {
		t.Fatalf("sleep %d did not start", pid)
	}
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"stat", "status", "cmdline"} {
		if lay, ok := instead[name]; ok {
			lay(filepath.Join(dir, name))
			continue
		}
		if err := testutil.CopyFile(filepath.Join("/proc", strconv.Itoa(pid), name), filepath.Join(dir, name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSweepForkLoop: a fork loop whose every child forks a new-session
// child and exits, racing the sweep of its cgroup, leaves nothing: frozen,
// it cannot fork; killed, the cgroup empties and is removed. A process of
// the same UID outside the cgroup lives.
func TestSweepForkLoop(t *testing.T) {
	for _, kind := range []Kind{KindCgroup2, KindFreezer} {
		t.Run(string(kind), func(t *testing.T) {
			c := contained(t, kind)
			script := filepath.Join(t.TempDir(), "loop.sh")
			if err := os.WriteFile(script, []byte(forkLoop), 0o644); err != nil {
				t.Fatal(err)
			}
			bystander := exec.Command("sleep", "1000000")
			bystander.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := bystander.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })

			startIn(t, c, "/bin/sh", script, "0")
			// Running: several generations gone by, kernels left behind.
			if !within(10*time.Second, func() bool { return len(cgroupProcs(t, c)) >= 4 }) {
				t.Fatalf("the fork loop did not get going: %v", cgroupProcs(t, c))
			}
			if !c.Exists() {
				t.Fatal("the cgroup does not exist")
			}
			res := Sweep(context.Background(), c, SweepOptions{})
			t.Logf("swept: outcome %s, method %s, killed %d, frozen %v, removed %v, err %v", res.Outcome, res.Method, len(res.Killed), res.Frozen, res.Removed, res.Err)
			if res.Outcome != action.Reaped || !res.Removed || res.Err != nil || len(res.Withheld) != 0 {
				t.Errorf("sweep = %+v, want reaped and removed", res)
			}
			if _, err := os.Lstat(filepath.Join(c.Mount, c.Path)); !os.IsNotExist(err) || c.Exists() {
				t.Errorf("the cgroup is still there: %v", err)
			}
			if left := proc.Running(script); len(left) > 0 {
				t.Errorf("the fork loop lives on: %v", left)
			}
			if within(200*time.Millisecond, func() bool { return len(proc.Running(script)) > 0 }) {
				t.Errorf("the fork loop came back: %v", proc.Running(script))
			}
			if !spared(bystander.Process.Pid) {
				t.Errorf("a same-UID process outside the cgroup was killed")
			}
		})
	}
}

// TestSweepWithholdsOtherUID: a process of another UID moved into the
// cgroup is reported and never signalled, and then the cgroup is not
// killed whole: the tree's own process dies through its pidfd, the
// cgroup stays (not empty) and the sweep says so.
func TestSweepWithholdsOtherUID(t *testing.T) {
	c := contained(t, KindCgroup2)
	mine := startIn(t, c, "sleep", "1000000")
	other := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000001")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	if !within(5*time.Second, func() bool {
		id, err := fingerprint.Read("/proc", other.Process.Pid)
		return err == nil && id.UID == 65534 && id.Comm == "sleep"
	}) {
		t.Fatal("the other UID's sleep did not start")
	}
	if err := os.WriteFile(filepath.Join(c.Mount, c.Path, "cgroup.procs"), []byte(strconv.Itoa(other.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if !within(5*time.Second, func() bool {
		id, err := fingerprint.Read("/proc", mine.Process.Pid)
		return err == nil && id.Comm == "sleep"
	}) {
		t.Fatal("the tree's sleep did not start")
	}

	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if res.Outcome != action.SkipForeign || res.Removed || res.Method != "pidfd" {
		t.Errorf("sweep = %+v, want skipped-foreign through pidfds, cgroup kept", res)
	}
	if !c.Exists() {
		t.Error("the cgroup holding another UID's process was removed")
	}
	if len(res.Withheld) != 1 || res.Withheld[0].PID != other.Process.Pid {
		t.Errorf("withheld %+v, want the other UID's %d", res.Withheld, other.Process.Pid)
	}
	if !spared(other.Process.Pid) {
		t.Errorf("the other UID's process was killed")
	}
	if state, _ := os.ReadFile(filepath.Join(c.Mount, c.Path, "cgroup.freeze")); strings.TrimSpace(string(state)) != "0" {
		t.Errorf("the cgroup was left frozen: %q", state)
	}
	if !exits(mine, 5*time.Second) {
		t.Error("the tree's own process lives")
	}
}

// TestSweepWithholdsASetuidProgram: a setuid program the tree's user ran
// (real UID the tree's, effective and saved root's) is not the tree's to
// signal: it is withheld, so the frozen cgroup is not killed whole
// (cgroup.kill would take it too), and the tree's own process dies
// through its pidfd.
func TestSweepWithholdsASetuidProgram(t *testing.T) {
	const uid = 65534
	c := containedAs(t, KindCgroup2, uid)
	mine := startIn(t, c, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000000")
	suid := startIn(t, c, "setpriv", "--ruid=65534", "--euid=0", "--init-groups", "sleep", "1000001")
	for _, cmd := range []*exec.Cmd{mine, suid} {
		if !within(5*time.Second, func() bool {
			id, err := fingerprint.Read("/proc", cmd.Process.Pid)
			return err == nil && id.Comm == "sleep" && id.UID == uid
		}) {
			t.Fatalf("%v did not start", cmd.Args)
		}
	}
	if id, err := fingerprint.Read("/proc", suid.Process.Pid); err != nil || id.RunsAs(uid) || id.EUID != 0 {
		t.Fatalf("the setuid sleep: %+v, %v; want real UID %d, effective 0", id, err, uid)
	}

	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if res.Method != "pidfd" || res.Removed {
		t.Errorf("sweep = %+v, want the tree's process killed through its pidfd, the cgroup kept", res)
	}
	if len(res.Withheld) != 1 || res.Withheld[0].PID != suid.Process.Pid {
		t.Errorf("withheld %+v, want the setuid sleep %d", res.Withheld, suid.Process.Pid)
	}
	if id, err := fingerprint.Read("/proc", suid.Process.Pid); err != nil || id.Zombie() {
		t.Errorf("the setuid program: %+v, %v; want it alive", id, err)
	}
	if state, _ := os.ReadFile(filepath.Join(c.Mount, c.Path, "cgroup.freeze")); strings.TrimSpace(string(state)) != "0" {
		t.Errorf("the cgroup was left frozen: %q", state)
	}
	if !exits(mine, 5*time.Second) {
		t.Error("the tree's own process lives")
	}
}

// TestSweepRefusesTheCaller: a cgroup holding the caller is never frozen.
func TestSweepRefusesTheCaller(t *testing.T) {
	c := contained(t, KindCgroup2)
	c.opt.Proc = t.TempDir()
	if err := os.MkdirAll(filepath.Join(c.opt.Proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.opt.Proc, "self", "cgroup"), []byte("0::/"+c.Path+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := Sweep(context.Background(), c, SweepOptions{}); res.Outcome != action.SkipForeign {
		t.Errorf("sweep = %+v, want refused", res)
	}
}

// TestSweepRefusesFromAnotherCgroupNamespace: in a cgroup namespace of its
// own (a pod's), the caller's "0::/" says nothing of where it is on the
// host: the sweep refuses rather than take it for "not inside".
func TestSweepRefusesFromAnotherCgroupNamespace(t *testing.T) {
	c := contained(t, KindCgroup2)
	c.opt.Proc = t.TempDir()
	for _, d := range []string{"self/ns", "1/ns"} {
		if err := os.MkdirAll(filepath.Join(c.opt.Proc, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.opt.Proc, "self", "cgroup"), []byte("0::/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("cgroup:[4026532001]", filepath.Join(c.opt.Proc, "self/ns/cgroup")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("cgroup:[4026531835]", filepath.Join(c.opt.Proc, "1/ns/cgroup")); err != nil {
		t.Fatal(err)
	}
	if res := Sweep(context.Background(), c, SweepOptions{}); res.Outcome != action.SkipForeign {
		t.Errorf("sweep = %+v, want refused", res)
	}
}

// TestSweepWithholdsAnotherContainersProcess: a process of the tree's
// own UID in the cgroup whose argv carries another container's ID (a
// kernel that ran `podman run`, its conmon moved in by hand) is reported,
// never signalled, and the cgroup is kept; the tree's own process dies.
func TestSweepWithholdsAnotherContainersProcess(t *testing.T) {
	c := contained(t, KindCgroup2)
	mine := startIn(t, c, "sleep", "1000000")
	// A shell that stops itself and so stays, childless, carrying the
	// other ID in its argv.
	other := startIn(t, c, "/bin/sh", "-c", "kill -STOP $$", "kc", newID(t))
	if !within(5*time.Second, func() bool {
		id, err := fingerprint.Read("/proc", mine.Process.Pid)
		st, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/stat", other.Process.Pid))
		return err == nil && id.Comm == "sleep" && err2 == nil && strings.Contains(string(st), ") T ")
	}) {
		t.Fatal("the processes did not start")
	}

	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if res.Removed || res.Method != "pidfd" {
		t.Errorf("sweep = %+v, want pidfds only and the cgroup kept", res)
	}
	if len(res.Withheld) != 1 || res.Withheld[0].PID != other.Process.Pid {
		t.Errorf("withheld %+v, want the other container's %d", res.Withheld, other.Process.Pid)
	}
	if !spared(other.Process.Pid) {
		t.Errorf("the other container's process was killed")
	}
	if !exits(mine, 5*time.Second) {
		t.Error("the tree's own process lives")
	}
}

// TestSweepWithholdsAnUnreadableProcess: a process whose status cannot be
// read (here: a /proc whose status for it lacks its UIDs) is nobody's to
// judge: it is withheld, so the frozen cgroup is not killed whole, and
// the readable member dies through its pidfd.
func TestSweepWithholdsAnUnreadableProcess(t *testing.T) {
	c := contained(t, KindCgroup2)
	readable := startIn(t, c, "sleep", "1000000")
	unreadable := startIn(t, c, "sleep", "1000001")
	root := t.TempDir()
	fakeProcOf(t, root, readable.Process.Pid, nil)
	fakeProcOf(t, root, unreadable.Process.Pid, map[string]func(string){"status": func(p string) {
		if err := os.WriteFile(p, []byte("Name:\tsleep\nState:\tS (sleeping)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}})

	res := Sweep(context.Background(), c, SweepOptions{Root: root, KillWait: 300 * time.Millisecond})
	if res.Outcome != action.SkipForeign || res.Removed || res.Method != "pidfd" {
		t.Errorf("sweep = %+v, want skipped-foreign through pidfds, cgroup kept", res)
	}
	if len(res.Withheld) != 1 || res.Withheld[0].PID != unreadable.Process.Pid || res.Withheld[0].UID != -1 {
		t.Errorf("withheld %+v, want the unreadable %d with no UID", res.Withheld, unreadable.Process.Pid)
	}
	if !spared(unreadable.Process.Pid) {
		t.Errorf("the unreadable process was killed")
	}
	if !exits(readable, 5*time.Second) {
		t.Error("the readable member lives")
	}
	if !c.Exists() {
		t.Error("the cgroup holding an unjudged process was removed")
	}
}

// TestSweepWithholdsTheNewborn: with BornBefore, a process that started
// after it (a restarted container's supervisor, put in the same cgroup
// after the sweep was decided) is withheld, and the older one killed.
func TestSweepWithholdsTheNewborn(t *testing.T) {
	c := contained(t, KindCgroup2)
	old := startIn(t, c, "sleep", "1000000")
	var oldStat fingerprint.Stat
	if !within(5*time.Second, func() bool {
		st, err := fingerprint.ReadStat("/proc", old.Process.Pid)
		oldStat = st
		return err == nil && st.Comm == "sleep"
	}) {
		t.Fatal("the first process did not start")
	}
	// Start ticks count in hundredths: the newborn must be a tick younger.
	var young *exec.Cmd
	if !within(5*time.Second, func() bool {
		if young != nil {
			young.Process.Kill()
			young.Wait()
		}
		young = startIn(t, c, "sleep", "1000000")
		st, err := fingerprint.ReadStat("/proc", young.Process.Pid)
		return err == nil && st.StartTicks > oldStat.StartTicks
	}) {
		t.Fatal("no process younger than the first by a tick")
	}

	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond, BornBefore: oldStat.StartTicks + 1})
	if len(res.Withheld) != 1 || res.Withheld[0].PID != young.Process.Pid {
		t.Errorf("withheld %+v, want the newborn %d", res.Withheld, young.Process.Pid)
	}
	if len(res.Killed) != 1 || res.Killed[0].PID != old.Process.Pid {
		t.Errorf("killed %+v, want the old %d", res.Killed, old.Process.Pid)
	}
	if !spared(young.Process.Pid) {
		t.Errorf("the newborn was killed")
	}
}

// inChild starts a process in a new child cgroup of c, both gone when
// the test ends, and returns it and the child's path.
func inChild(t *testing.T, c *Cgroup) (*exec.Cmd, string) {
	t.Helper()
	sub := filepath.Join(c.Mount, c.Path, "nested")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// Registered after contained's: runs first, so the parent can go.
	t.Cleanup(func() {
		within(5*time.Second, func() bool { return os.Remove(sub) == nil || os.IsNotExist(os.Remove(sub)) })
	})
	nested := exec.Command("sleep", "1000000")
	if err := nested.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // runs before the removal above
		nested.Process.Kill()
		nested.Wait()
	})
	if err := os.WriteFile(filepath.Join(sub, "cgroup.procs"), []byte(strconv.Itoa(nested.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	return nested, sub
}

// TestSweepLeavesChildCgroups: cgroup.kill would take a child cgroup's
// processes too, which the sweep never listed nor judged: with a child
// cgroup present the tree's own process is killed through its pidfd and
// the child's lives.
func TestSweepLeavesChildCgroups(t *testing.T) {
	c := contained(t, KindCgroup2)
	nested, _ := inChild(t, c)
	mine := startIn(t, c, "sleep", "1000000")
	if !within(5*time.Second, func() bool {
		id, err := fingerprint.Read("/proc", mine.Process.Pid)
		return err == nil && id.Comm == "sleep"
	}) {
		t.Fatal("the tree's process did not start")
	}

	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if res.Method == "cgroup.kill" || res.Removed {
		t.Errorf("sweep = %+v, want no cgroup.kill and the cgroup kept", res)
	}
	if st, err := fingerprint.ReadStat("/proc", nested.Process.Pid); err != nil || st.Zombie() {
		t.Errorf("the child cgroup's process was killed: %+v, %v", st, err)
	}
	if !exits(mine, 5*time.Second) {
		t.Error("the tree's own process lives")
	}
}

// stopRecorder is a Scoper that records the scopes it is asked to stop.
type stopRecorder struct{ stopped []string }

func (r *stopRecorder) StartScope(context.Context, string, string, int) (string, error) {
	return "", errors.New("not here")
}
func (r *stopRecorder) StopScope(_ context.Context, unit string) error {
	r.stopped = append(r.stopped, unit)
	return nil
}
func (r *stopRecorder) Close() error { return nil }

// TestSweepKeepsAScopeWithChildProcesses: stopping a scope has systemd
// kill its child cgroups' processes, which no rule judged; a scope whose
// children still hold some is not stopped, and one empty is.
func TestSweepKeepsAScopeWithChildProcesses(t *testing.T) {
	c := contained(t, KindCgroup2)
	rec := &stopRecorder{}
	// The scope's cgroup is a cgroup v2 directory like any other; only
	// how it is removed differs.
	c.Kind, c.Unit, c.scoper = KindSystemd, "kc-test.scope", rec
	nested, sub := inChild(t, c)
	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if len(rec.stopped) != 0 || res.Err == nil {
		t.Errorf("with a child cgroup's process: stopped %q, err %v; want the scope kept, and said", rec.stopped, res.Err)
	}
	nested.Process.Kill()
	nested.Wait()
	if !within(5*time.Second, func() bool { return os.Remove(sub) == nil }) {
		t.Fatal("the child cgroup would not go")
	}
	res = Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if len(rec.stopped) != 1 || res.Err != nil {
		t.Errorf("empty: stopped %q, err %v; want the scope stopped", rec.stopped, res.Err)
	}
}

// TestSweepOfAGoneScopeStopsNothing: a scope's cgroup already gone has
// nothing of the tree's left; a unit of its name now is a restarted
// container's, whose supervisor stopping it would kill.
func TestSweepOfAGoneScopeStopsNothing(t *testing.T) {
	c := contained(t, KindCgroup2)
	rec := &stopRecorder{}
	c.Kind, c.Unit, c.scoper = KindSystemd, "kc-test.scope", rec
	if err := os.Remove(filepath.Join(c.Mount, c.Path)); err != nil {
		t.Fatal(err)
	}
	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond})
	if len(rec.stopped) != 0 || !res.Removed || res.Err != nil {
		t.Errorf("stopped %q, removed %v, err %v; want nothing stopped, the cgroup reported removed", rec.stopped, res.Removed, res.Err)
	}
}

// TestSweepStopsOnlyTheScopeItSwept: a scope's name may be a new scope's
// by the time the sweep would stop it (systemd collected the emptied one
// and a restart of the container started another): the stop is sent
// only while the name's cgroup is the one swept.
func TestSweepStopsOnlyTheScopeItSwept(t *testing.T) {
	c := contained(t, KindCgroup2)
	c.Kind, c.Unit = KindSystemd, "kc-test.scope"
	mfd, err := openMount(c.Mount, KindCgroup2)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	open := func() int {
		t.Helper()
		fd, err := openPath(mfd, c.Path, KindCgroup2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	swept := open()
	rec := &stopRecorder{}
	if err := c.stopScope(context.Background(), rec, mfd, swept); err != nil || len(rec.stopped) != 1 {
		t.Fatalf("the scope swept: stopped %q, %v; want it stopped", rec.stopped, err)
	}
	// Collected, and a scope of its name started again.
	dir := filepath.Join(c.Mount, c.Path)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rec = &stopRecorder{}
	if err := c.stopScope(context.Background(), rec, mfd, swept); err != nil || len(rec.stopped) != 0 {
		t.Errorf("a new scope of the name: stopped %q, %v; want it left alone", rec.stopped, err)
	}
}

// TestPrepareThawsAReusedCgroup: a cgroup left frozen (its wrapper killed
// between freeze and thaw) is thawed when the container's next wrapper
// takes it again, or its supervisor would start frozen.
func TestPrepareThawsAReusedCgroup(t *testing.T) {
	c := contained(t, KindCgroup2)
	freeze := filepath.Join(c.Mount, c.Path, "cgroup.freeze")
	if err := os.WriteFile(freeze, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	again, err := Prepare(context.Background(), Detect(Options{}), c.containerID, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if data, err := os.ReadFile(freeze); err != nil || strings.TrimSpace(string(data)) != "0" {
		t.Errorf("cgroup.freeze = %q, %v after Prepare reused it; want 0", data, err)
	}
}

// TestCgroupKillOnlyWhenFrozen: cgroup.kill takes whatever is in the
// cgroup when it is written, judged or not, so it is written only while
// the cgroup is frozen (nothing in it can fork or exec since it was
// judged); a cgroup whose freeze did not take has its judged processes
// killed one by one through their pidfds.
func TestCgroupKillOnlyWhenFrozen(t *testing.T) {
	for _, tc := range []struct {
		frozen bool
		// bornBefore: a decision that spares what was born after it; a
		// process started into the cgroup from outside after the last
		// look would be taken by cgroup.kill.
		bornBefore uint64
		want       string
	}{
		{false, 0, "pidfd"},
		{true, 0, "cgroup.kill"},
		{true, math.MaxUint64, "sigkill-frozen"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			c := contained(t, KindCgroup2)
			cmd := startIn(t, c, "sleep", "1000000")
			if !within(5*time.Second, func() bool {
				id, err := fingerprint.Read("/proc", cmd.Process.Pid)
				return err == nil && id.Comm == "sleep"
			}) {
				t.Fatal("the tree's sleep did not start")
			}
			mfd, err := openMount(c.Mount, c.Kind)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(mfd)
			fd, err := openPath(mfd, c.Path, c.Kind)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			res := SweepResult{}
			if tc.frozen {
				if res.Frozen = c.freeze(fd, 5*time.Second); !res.Frozen {
					t.Fatal("the cgroup did not freeze")
				}
				defer c.thaw(fd)
			}
			c.kill(fd, SweepOptions{BornBefore: tc.bornBefore}.withDefaults(), &res)
			if res.Method != tc.want || res.Err != nil || len(res.Killed) != 1 {
				t.Errorf("kill: method %q, killed %d, err %v; want %q, 1", res.Method, len(res.Killed), res.Err, tc.want)
			}
			if err := c.thaw(fd); err != nil {
				t.Fatal(err)
			}
			if !exits(cmd, 5*time.Second) {
				t.Error("the tree's process lives")
			}
		})
	}
}

// TestSweepOutOfTimeFreezesNothing: a sweep that starts with its caller's
// time up (kc-hook's poststop exits at its deadline, this still running)
// freezes nothing, which would be left frozen with what it spares; the
// judged processes are killed through their pidfds all the same.
func TestSweepOutOfTimeFreezesNothing(t *testing.T) {
	c := contained(t, KindCgroup2)
	p := startIn(t, c, "sleep", "1000000")
	if !within(5*time.Second, func() bool {
		st, err := fingerprint.ReadStat("/proc", p.Process.Pid)
		return err == nil && st.Comm == "sleep"
	}) {
		t.Fatal("the process did not start")
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	res := Sweep(ctx, c, SweepOptions{KillWait: 300 * time.Millisecond})
	if res.Frozen || res.Method != "pidfd" {
		t.Errorf("sweep = %+v, want no freeze, pidfds", res)
	}
	if !exits(p, 5*time.Second) {
		t.Error("the judged process lives")
	}
	if state, _ := os.ReadFile(filepath.Join(c.Mount, c.Path, "cgroup.freeze")); strings.TrimSpace(string(state)) == "1" {
		t.Error("the cgroup was left frozen")
	}
}

// TestSweepWithTheCommandsUID: a wrapper's command started through
// setpriv adds its UID to the tree's (SweepOptions.UIDs): its processes in
// the cgroup die; a third UID's is still withheld and spared.
func TestSweepWithTheCommandsUID(t *testing.T) {
	c := contained(t, KindCgroup2)
	start := func(uid string) *exec.Cmd {
		cmd := exec.Command("setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups", "sleep", "1000001")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if !within(5*time.Second, func() bool {
			id, err := fingerprint.Read("/proc", cmd.Process.Pid)
			return err == nil && strconv.Itoa(id.UID) == uid && id.Comm == "sleep"
		}) {
			t.Fatalf("uid %s's sleep did not start", uid)
		}
		if err := os.WriteFile(filepath.Join(c.Mount, c.Path, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	command, third := start("65533"), start("65534")
	res := Sweep(context.Background(), c, SweepOptions{KillWait: 300 * time.Millisecond, UIDs: []int{65533}})
	if len(res.Withheld) != 1 || res.Withheld[0].PID != third.Process.Pid || res.Method != "pidfd" {
		t.Errorf("sweep = %+v, want the third UID's %d withheld, pidfds", res, third.Process.Pid)
	}
	if !exits(command, 5*time.Second) {
		t.Error("the command's UID's process lives")
	}
	if !spared(third.Process.Pid) {
		t.Error("the third UID's process was killed")
	}
}
