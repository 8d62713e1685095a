package supervise_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
)

// forkLoop: each generation starts the next in a session of its own and
// exits at once; every 25th leaves a "kernel" behind. SIGTERM is ignored
// (and stays so across exec), so a polite stop's grace is all the loop's.
// Bounded, so a failing test does not leave it running for ever.
const forkLoop = `trap '' TERM
[ "$1" = kernel ] && while :; do sleep 1; done
n=$1
[ "$n" -lt 20000 ] || exit 0
[ $((n % 25)) -eq 0 ] && setsid /bin/sh "$0" kernel &
setsid /bin/sh "$0" $((n+1)) &
`

// TestContainedForkLoopDiesWithInit: a supervised tree whose kernel runs
// a fork loop of new sessions (each generation orphaned at once) dies
// whole when the container's init dies, and its cgroup is gone. The
// group's stop and the descendant walk alone lose that race (with
// --no-contain, the loop lives on): the cgroup is frozen and killed.
func TestContainedForkLoopDiesWithInit(t *testing.T) {
	if h := contain.Detect(contain.Options{}); h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	script := filepath.Join(t.TempDir(), "loop.sh")
	if err := os.WriteFile(script, []byte(forkLoop), 0o644); err != nil {
		t.Fatal(err)
	}
	// A loop that outlived a failed teardown keeps forking: one pass
	// of kills misses the children born meanwhile.
	t.Cleanup(func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			left := proc.Running(script)
			if len(left) == 0 {
				return
			}
			killAll(left)
		}
		t.Errorf("the fork loop %s could not be stopped", script)
	})
	w := startWrapper(t, init, []string{"--kill-grace=1s"}, "/bin/sh", "-c", `/bin/sh "$0" 0 & exec sleep 1000000`, script)
	// Each generation lives a moment: several seen, one after the other.
	seen := map[int]bool{}
	supervisetest.Eventually(t, 10*time.Second, "the fork loop running", func() bool {
		for _, p := range proc.Running(script) {
			seen[p] = true
		}
		return len(seen) >= 5
	})

	if err := initCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := w.exitCode(t, 30*time.Second); code != 0 {
		t.Errorf("wrapper exit code %d:\n%s", code, w.logText())
	}
	if left := proc.Running(script); len(left) > 0 {
		t.Errorf("the fork loop lives on after the teardown: %v\n%s", left, w.logText())
	}
	if cg := filepath.Join(cgroup2Mount(), "kc-watchman", cid); exists(cg) {
		t.Errorf("the cgroup %s is still there", cg)
	}
	st, err := ledger.OpenReadOnly(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.Load(cid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cgroup == nil || rec.Cgroup.Kind != "cgroup2" || rec.Cgroup.Path != "kc-watchman/"+cid || !rec.Cgroup.Removed || rec.Cgroup.Outcome == action.WouldNotDie {
		t.Errorf("recorded cgroup %+v, want kc-watchman/%s, removed", rec.Cgroup, cid)
	}
}

func cgroup2Mount() string { return contain.Detect(contain.Options{}).Mount }

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func killAll(pids []int) {
	for _, p := range pids {
		if st, err := fingerprint.ReadStat("/proc", p); err == nil {
			supervisetest.KillProcess(st)
		}
	}
}

// TestGivingUpRemovesCgroup: a command that keeps exiting spends its
// restarts, and the wrapper that gives up removes the cgroup it made for
// it (it used to keep it for a restart that never came).
func TestGivingUpRemovesCgroup(t *testing.T) {
	if h := contain.Detect(contain.Options{}); h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	_, init := supervisetest.Process(t, "sleep", "1000000")
	for _, tc := range []struct{ name, restarts string }{
		{"no restart", "--max-restarts=0"},
		{"after one restart", "--max-restarts=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWrapper(t, init, []string{tc.restarts, "--restart-delay=10ms"}, "/bin/sh", "-c", "exit 3")
			if code := w.exitCode(t, 30*time.Second); code == 0 {
				t.Errorf("wrapper exit code 0, want the give-up's:\n%s", w.logText())
			}
			if !strings.Contains(w.logText(), "giving up") {
				t.Fatalf("the wrapper did not give up:\n%s", w.logText())
			}
			if cg := filepath.Join(cgroup2Mount(), "kc-watchman", cid); exists(cg) {
				t.Errorf("the cgroup %s is still there after the wrapper gave up:\n%s", cg, w.logText())
			}
		})
	}
}

// TestSupervisorOutputBounded: a supervisor (its kernels) printing without
// end fills its log file only up to the cap: the wrapper empties it and
// says so, and the last output is kept.
func TestSupervisorOutputBounded(t *testing.T) {
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	const printed = 3*supervise.DefaultOutputCap + 12345
	w := startWrapper(t, init, []string{"--no-contain"}, "/bin/sh", "-c",
		`head -c "$0" /dev/zero | tr '\0' x; echo; echo the-last-line; exec sleep 1000000`, strconv.Itoa(printed))
	supervisetest.Eventually(t, 30*time.Second, "the command's last line in the log", func() bool {
		return strings.Contains(w.logText(), "the-last-line")
	})
	if err := initCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	w.exitCode(t, 30*time.Second)
	st, err := os.Stat(w.log)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > supervise.DefaultOutputCap+64<<10 {
		t.Errorf("the log holds %d bytes after %d printed, cap %d", st.Size(), printed, supervise.DefaultOutputCap)
	}
	if !strings.Contains(w.logText(), "output over") {
		t.Error("the log does not say it was emptied")
	}
}

// TestOrphanedMemberGetsTheGroupsTerm: a contained wrapper finds its
// group's members by walking below itself rather than listing /proc. A
// member whose parent exited (a double fork that stays in the group) was
// reparented to the wrapper, the subreaper: the walk reaches it, and it
// gets the group's SIGTERM and its grace. Missed, it would die only of
// the cgroup sweep's SIGKILL, its TERM handler never run.
func TestOrphanedMemberGetsTheGroupsTerm(t *testing.T) {
	if h := contain.Detect(contain.Options{}); h.Kind != contain.KindCgroup2 {
		t.Skipf("containment here is %s (%s)", h, h.Why)
	}
	initCmd, init := supervisetest.Process(t, "sleep", "1000000")
	dir := t.TempDir()
	pidFile, mark := filepath.Join(dir, "orphan.pid"), filepath.Join(dir, "term")
	// The subshell exits at once, orphaning the sh inside it; the trap
	// runs when its foreground sleep dies of the same SIGTERM.
	orphan := `trap 'echo term > "$2"; exit 0' TERM; echo $$ > "$1"; while :; do sleep 1; done`
	w := startWrapper(t, init, []string{"--kill-grace=5s"}, "/bin/sh", "-c",
		`(/bin/sh -c "$0" orphan "$1" "$2" &); exec sleep 1000000`, orphan, pidFile, mark)

	var st fingerprint.Stat
	supervisetest.Eventually(t, 10*time.Second, "the orphan reparented to the wrapper", func() bool {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return false
		}
		st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		return err == nil && st.PPID == w.st.PID && st.PGID == w.st.PID
	})
	t.Cleanup(func() { supervisetest.KillProcess(st) })

	if err := initCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := w.exitCode(t, 30*time.Second); code != 0 {
		t.Errorf("wrapper exit code %d:\n%s", code, w.logText())
	}
	if !supervisetest.Dead(st) {
		t.Fatalf("the orphaned member %d lives on:\n%s", st.PID, w.logText())
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("the orphaned member died without its SIGTERM (%v): the group's stop missed it\n%s", err, w.logText())
	}
}
