package supervise_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// cid is this test binary's own container ID, so that no other package's
// test (a poststop, a reconcile) ever takes these trees for its own.
var cid = func() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}()

func TestMain(m *testing.M) {
	proc.Main() // the innocent helper processes of signal_test.go
	code := m.Run()
	supervisetest.RemoveBuild()
	testutil.RemoveContainParents()
	os.Exit(code)
}

// wrapper is a `kc-hook supervise` process started by a test.
type wrapper struct {
	cmd      *exec.Cmd
	st       fingerprint.Stat
	log      string
	stateDir string
	done     chan struct{}
}

func (w *wrapper) logText() string {
	b, _ := os.ReadFile(w.log)
	return string(b)
}

// exitCode waits up to timeout for the wrapper to exit.
func (w *wrapper) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("wrapper %d still running after %v; log:\n%s", w.st.PID, timeout, w.logText())
	}
	return w.cmd.ProcessState.ExitCode()
}

func (w *wrapper) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// startWrapper runs kc-hook supervise for init with the flags and command.
// It is started as a plain child, in the test's process group: leading its
// own group is the wrapper's job. Cleanup SIGKILLs whatever is left of its
// group (and of extraGroups) by identity.
func startWrapper(t *testing.T, init fingerprint.Stat, flags []string, command ...string) *wrapper {
	t.Helper()
	return startWrapperWith(t, nil, init, flags, command...)
}

// startWrapperWith is startWrapper with the wrapper's process attributes
// (a shell's job: Setpgid).
func startWrapperWith(t *testing.T, attr *syscall.SysProcAttr, init fingerprint.Stat, flags []string, command ...string) *wrapper {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bin := supervisetest.BuildKCHook(t)
	dir := t.TempDir()
	w := &wrapper{log: filepath.Join(dir, "supervise.log"), stateDir: filepath.Join(dir, "state"), done: make(chan struct{})}
	logf, err := os.Create(w.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	argv := append([]string{"--state-dir=" + w.stateDir}, "supervise", "--refresh=100ms")
	argv = append(argv, flags...)
	argv = append(argv, cid, strconv.Itoa(init.PID), strconv.FormatUint(init.StartTicks, 10), "--")
	argv = append(argv, command...)
	w.cmd = exec.Command(bin, argv...)
	w.cmd.SysProcAttr = attr
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.cmd.Wait(); close(w.done) }() //nolint:errcheck // ProcessState is read later
	w.st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	pgid := w.st.PID // the group the wrapper will lead
	supervisetest.KillGroups(t, func() []int { return []int{pgid} }, w.st)
	t.Cleanup(func() { testutil.RemoveContainCgroups(t, cid) })
	t.Cleanup(func() {
		w.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // it may be gone
		<-w.done
		if t.Failed() {
			t.Logf("wrapper log:\n%s", w.logText())
		}
	})
	return w
}

// fakeKCServer returns the command line of the fake supervisor with two
// children and the extra KCFAKE_* settings (through env(1), which execs
// it), and the ready file it writes its pid to. Like real kcserver it
// stays in the wrapper's group and carries no container ID.
func fakeKCServer(t *testing.T, sockDir string, extraEnv ...string) ([]string, string) {
	bin := testutil.BuildKCServer(t)
	ready := filepath.Join(t.TempDir(), "ready")
	argv := append([]string{"env", "KCFAKE_READY_FILE=" + ready, "KCFAKE_CHILDREN=2"}, extraEnv...)
	return append(argv, bin, "--transport=socket", "--socket-dir="+sockDir), ready
}

// waitReady returns the fake's identity once it has written its ready
// file.
func waitReady(t *testing.T, w *wrapper, ready string) fingerprint.Stat {
	t.Helper()
	var st fingerprint.Stat
	supervisetest.Eventually(t, 15*time.Second, "fake kcserver never got ready", func() bool {
		data, err := os.ReadFile(ready)
		if err != nil {
			return w.exited()
		}
		first, _, _ := strings.Cut(string(data), "\n")
		pid, err := strconv.Atoi(first)
		if err != nil {
			return false
		}
		st, err = fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		return err == nil
	})
	if st.PID == 0 {
		t.Fatalf("wrapper exited before the fake was ready:\n%s", w.logText())
	}
	return st
}

func groupOf(pgid int) []fingerprint.Stat {
	return pgkill.Members(fingerprint.DefaultRoot, pgid)
}

func allDead(ms []fingerprint.Stat) bool {
	for _, m := range ms {
		if !supervisetest.Dead(m) {
			return false
		}
	}
	return true
}

func treeOf(t *testing.T, comms []string, pgid int) *trees.Tree {
	t.Helper()
	found, _, err := trees.Scan(trees.Options{Comms: comms})
	if err != nil {
		t.Fatal(err)
	}
	for i := range found {
		if found[i].PGID == pgid {
			return &found[i]
		}
	}
	return nil
}

// TestInitDeathTakesGroupDown: the wrapper and its supervisor form a
// supervisor tree the janitor recognises (container ID in argv, socket,
// ledger snapshot); when the container's init dies the whole group goes.
func TestInitDeathTakesGroupDown(t *testing.T) {
	for _, mode := range []string{"pidfd", "poll"} {
		t.Run(mode, func(t *testing.T) {
			_, init := supervisetest.Process(t, "sleep", "1000000")
			sockDir := t.TempDir()
			argv, ready := fakeKCServer(t, sockDir)
			flags := []string{"--kill-grace=2s"}
			if mode == "poll" {
				flags = append(flags, "--poll-init", "--init-poll=50ms")
			}
			w := startWrapper(t, init, flags, argv...)
			kc := waitReady(t, w, ready)

			var members []fingerprint.Stat
			supervisetest.Eventually(t, 5*time.Second, "group never held wrapper, fake and its 2 children", func() bool {
				members = groupOf(w.st.PID)
				return len(members) == 4
			})
			if !slices.ContainsFunc(members, func(m fingerprint.Stat) bool { return fingerprint.Same(m, kc) }) {
				t.Fatalf("fake %d not in the wrapper's group: %+v", kc.PID, members)
			}
			// The wrapper's comm always counts as a supervisor: the tree
			// is found even with an unrelated supervisor set.
			for _, comms := range [][]string{{"kcserver"}, {"something-else"}} {
				tr := treeOf(t, comms, w.st.PID)
				if tr == nil || tr.ContainerID != cid || !tr.Signalable() {
					t.Fatalf("comms %v: wrapper group is not a signalable tree of %s: %+v", comms, cid[:12], tr)
				}
			}
			sock := filepath.Join(sockDir, fmt.Sprintf("kc-%d.sock", kc.PID))
			if _, err := os.Stat(sock); err != nil {
				t.Fatalf("socket: %v", err)
			}
			if !strings.Contains(w.logText(), `"method":"`+mode+`"`) {
				t.Errorf("wrapper did not log watch method %s:\n%s", mode, w.logText())
			}
			store, err := ledger.Open(w.stateDir)
			if err != nil {
				t.Fatal(err)
			}
			supervisetest.Eventually(t, 5*time.Second, "no ledger snapshot of all 4 members", func() bool {
				rec, err := store.Load(cid)
				return err == nil && len(rec.Trees) == 1 && rec.Trees[0].Source == supervise.SnapshotSource &&
					rec.Trees[0].PGID == w.st.PID && len(rec.Trees[0].Members) == 4
			})

			killed := time.Now()
			if err := syscall.Kill(init.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			supervisetest.Eventually(t, 10*time.Second, "group still alive after init died", func() bool { return allDead(members) })
			t.Logf("group down %v after init was killed", time.Since(killed).Round(time.Millisecond))
			if code := w.exitCode(t, 10*time.Second); code != 0 {
				t.Fatalf("wrapper exit code %d, want 0", code)
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("socket still there (fake got no SIGTERM?): %v", err)
			}
			rec, err := store.Load(cid)
			if err != nil || len(rec.Trees) != 1 || rec.Trees[0].Action != "reaped" {
				t.Errorf("ledger after teardown: %+v, %v", rec, err)
			}
		})
	}
}

// TestStopSignal: SIGTERM to the wrapper takes the group down; a member
// that ignores SIGTERM gets SIGKILL after the grace.
func TestStopSignal(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	argv, ready := fakeKCServer(t, t.TempDir(), "KCFAKE_STUBBORN_CHILD=1")
	w := startWrapper(t, init, []string{"--kill-grace=300ms"}, argv...)
	waitReady(t, w, ready)
	var members []fingerprint.Stat
	supervisetest.Eventually(t, 5*time.Second, "group incomplete", func() bool {
		members = groupOf(w.st.PID)
		// wrapper, fake, 2 children, stubborn child once its shell has
		// set the trap and exec'd sleep
		return len(members) == 5 && !slices.ContainsFunc(members, func(m fingerprint.Stat) bool { return m.Comm == "sh" })
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := w.exitCode(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if !allDead(members) {
		t.Fatalf("members alive after the wrapper exited: %+v", groupOf(w.st.PID))
	}
	if !strings.Contains(w.logText(), "SIGKILL") {
		t.Errorf("no SIGKILL phase logged for the stubborn child:\n%s", w.logText())
	}
	if !fingerprint.Alive(fingerprint.DefaultRoot, init) {
		t.Errorf("the init process was touched")
	}
}

// TestPdeathsig: a SIGKILLed wrapper cannot take its group down; the
// parent-death signal still ends its child.
func TestPdeathsig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		extra []string
	}{
		{"TERM", nil, nil},
		{"KILL to a supervisor ignoring TERM", []string{"--pdeathsig=KILL"}, []string{"KCFAKE_IGNORE_TERM=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, init := supervisetest.Process(t, "sleep", "1000000")
			argv, ready := fakeKCServer(t, t.TempDir(), tc.extra...)
			w := startWrapper(t, init, tc.flags, argv...)
			kc := waitReady(t, w, ready)
			if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			supervisetest.Eventually(t, 10*time.Second, "the wrapper's child outlived it", func() bool { return supervisetest.Dead(kc) })
		})
	}
}

// TestBoundedRetries: a command that keeps exiting is restarted
// max-restarts times with backoff, then the wrapper gives up (exit 1).
func TestBoundedRetries(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	count := filepath.Join(t.TempDir(), "runs")
	w := startWrapper(t, init, []string{"--max-restarts=2", "--restart-delay=50ms"}, "/bin/sh", "-c", "echo run >> "+count+"; exit 3")
	if code := w.exitCode(t, 15*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	data, _ := os.ReadFile(count)
	if n := strings.Count(string(data), "run"); n != 3 {
		t.Fatalf("command ran %d times, want 3 (1 + 2 restarts)", n)
	}
	log := w.logText()
	for _, want := range []string{"giving up", `"in":"50ms"`, `"in":"100ms"`, "exit status 3"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// TestCommandNotFound: a command that cannot start counts against the
// budget too.
func TestCommandNotFound(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	w := startWrapper(t, init, []string{"--max-restarts=1", "--restart-delay=10ms"}, "/nonexistent/kcserver")
	if code := w.exitCode(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if n := strings.Count(w.logText(), "command did not start"); n != 2 {
		t.Fatalf("%d start attempts logged, want 2:\n%s", n, w.logText())
	}
}

// TestRestartClearsLeftovers: what a crashed command left in the group is
// taken down before the next start, so restarts do not pile up trees.
func TestRestartClearsLeftovers(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	pids := filepath.Join(t.TempDir(), "pids")
	w := startWrapper(t, init, []string{"--max-restarts=1", "--restart-delay=10ms", "--kill-grace=1s"},
		"/bin/sh", "-c", "sleep 1000000 & echo $! >> "+pids+"; exit 1")
	if code := w.exitCode(t, 15*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	data, _ := os.ReadFile(pids)
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		t.Fatalf("want 2 runs, got pids %q", fields)
	}
	for _, f := range fields {
		pid, _ := strconv.Atoi(f)
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		if err == nil && st.PGID == w.st.PID && !st.Zombie() {
			t.Errorf("leftover %d of a crashed run is still alive", pid)
		}
	}
}

// TestInitAlreadyGone: a wrapper started for an init that has already
// died (or whose PID now belongs to another process) never runs the
// command and exits 0.
func TestInitAlreadyGone(t *testing.T) {
	_, other := supervisetest.Process(t, "sleep", "1000000")
	stale := fingerprint.Stat{PID: other.PID, StartTicks: other.StartTicks - 1} // a recycled PID
	marker := filepath.Join(t.TempDir(), "ran")
	w := startWrapper(t, stale, nil, "/bin/sh", "-c", "touch "+marker)
	if code := w.exitCode(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran although init was gone")
	}
	if !strings.Contains(w.logText(), "init is gone") {
		t.Errorf("log:\n%s", w.logText())
	}
}

// TestCommandLeavingTheGroup: a supervisor that calls setsid itself leaves
// the wrapper's group; the wrapper still takes its group down.
func TestCommandLeavingTheGroup(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	argv, ready := fakeKCServer(t, t.TempDir())
	// setsid(1), not in the wrapper's group's lead, calls setsid and execs.
	w := startWrapper(t, init, []string{"--kill-grace=1s"}, append([]string{"setsid"}, argv...)...)
	kc := waitReady(t, w, ready)
	supervisetest.KillGroups(t, func() []int { return []int{kc.PID} })
	var members []fingerprint.Stat
	supervisetest.Eventually(t, 5*time.Second, "fake's own group incomplete", func() bool {
		members = groupOf(kc.PID)
		return len(members) == 3
	})
	if err := syscall.Kill(init.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	supervisetest.Eventually(t, 10*time.Second, "the fake's own group outlived init", func() bool { return allDead(members) })
	if code := w.exitCode(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// TestCommandJoiningAnotherGroup: a wrapper started by hand as a shell's
// job already leads its group and stays in the shell's session, whose
// other groups its command may join. Such a group is not the wrapper's:
// when init dies, its other members live.
func TestCommandJoiningAnotherGroup(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	victim := exec.Command("sleep", "1000000")
	victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // another job of the session
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		victim.Process.Kill()
		victim.Wait()
	})
	vpid := victim.Process.Pid
	joins := fmt.Sprintf(`setpgrp(0, %d) or die "setpgid: $!"; sleep 1000000`, vpid)
	w := startWrapperWith(t, &syscall.SysProcAttr{Setpgid: true}, init, []string{"--kill-grace=1s"}, "perl", "-e", joins)
	var cmd int
	supervisetest.Eventually(t, 5*time.Second, "the command did not join the other group", func() bool {
		for _, m := range groupOf(vpid) {
			if m.PID != vpid {
				cmd = m.PID
				return true
			}
		}
		return false
	})
	// Through a pidfd taken now: by cleanup time the PID may be
	// another process's.
	if pfd, err := unix.PidfdOpen(cmd, 0); err == nil {
		t.Cleanup(func() { unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); unix.Close(pfd) })
	}
	if err := syscall.Kill(init.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.exitCode(t, 10*time.Second)
	if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, vpid); err != nil || st.Zombie() {
		t.Errorf("the other group's process was killed with the wrapper's: %+v, %v", st, err)
	}
}

func TestUsage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bin := supervisetest.BuildKCHook(t)
	for _, args := range [][]string{
		{"supervise"},
		{"supervise", cid, "1234", "5678"},
		{"supervise", cid[:12], "1234", "5678", "--", "/bin/true"},
		{"supervise", cid, "x", "5678", "--", "/bin/true"},
		{"supervise", "--pdeathsig=STOP", cid, "1234", "5678", "--", "/bin/true"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("%q: err %v, want exit 2; output %s", args, err, out)
		}
	}
}

// TestWrapperRefusesASharedGroup: a wrapper that already leads a group
// holding another process (run by hand at the head of a pipeline, or
// exec'd by a shell with a background job) refuses to run: that process
// would be taken down and recorded as the tree's. Nothing is started,
// nothing signalled.
func TestWrapperRefusesASharedGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	_, init := supervisetest.Process(t, "sleep", "1000000")
	bin := supervisetest.BuildKCHook(t)
	dir := t.TempDir()
	marker, pidFile := filepath.Join(dir, "ran"), filepath.Join(dir, "bystander")
	args := []string{"--state-dir=" + filepath.Join(dir, "state"), "supervise", cid, strconv.Itoa(init.PID), strconv.FormatUint(init.StartTicks, 10), "--", "/bin/sh", "-c", "touch " + marker}
	// The shell leads the group, leaves a job in it and execs the wrapper.
	cmd := exec.Command("/bin/sh", append([]string{"-c", `sleep 1000002 >/dev/null 2>&1 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; exec "$@"`, pidFile, bin}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	supervisetest.KillGroups(t, func() []int { return []int{pgid} })
	err := cmd.Wait()
	if err == nil {
		t.Fatalf("the wrapper ran in a shared group:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "also holds sleep") {
		t.Errorf("output does not name the bystander:\n%s", out.String())
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	bystander, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if err := syscall.Kill(bystander, 0); err != nil {
		t.Errorf("the bystander %d was signalled: %v", bystander, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran")
	}
}
