// Package proc spawns real processes for tests and waits on /proc
// conditions. Waiting always polls a condition against a deadline; nothing
// here sleeps in place of checking.
//
// Tests that use the helper processes (StartInnocent, StartZombieLeader)
// must call Main first thing in TestMain:
//
//	func TestMain(m *testing.M) { proc.Main(); os.Exit(m.Run()) }
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Poll calls cond until it returns true or timeout has passed, backing off
// from 50µs to 2ms between calls. It returns the last result of cond.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := 50 * time.Microsecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(wait)
		if wait < 2*time.Millisecond {
			wait *= 2
		}
	}
}

// WaitFor fails t unless cond holds within timeout. Call it only from the
// test's goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Start starts cmd and registers a cleanup that kills and reaps it.
func Start(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() { Reap(cmd) })
	return cmd
}

// Reap kills cmd's process with SIGKILL unless it has already been waited
// for, then waits for it. Until it is reaped the child's PID cannot be
// handed to another process, so killing by its PID is safe. Reap may be
// called more than once.
func Reap(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// StartGroup starts cmd as the leader of a new process group and registers
// a cleanup that SIGKILLs the whole group, reaps the leader and waits until
// no live member is left. Use it for a command that forks (`sh -c "a; b"`
// runs a as a child): Start would kill only the shell and leave the child
// to PID 1. Children are not ours to wait for; an orphan killed here may
// stay a zombie until PID 1 reaps it, which counts as gone.
func StartGroup(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() { KillGroup(t, cmd) })
	return cmd
}

// KillGroup SIGKILLs the process group led by cmd (started by StartGroup),
// reaps the leader and waits up to 10s until no live process is left in
// the group, failing t otherwise. While the leader is unreaped its PID, and
// so the group ID, cannot be reused; after that the group ID is signalled
// only while live members are seen, which keep it from being reused too.
// KillGroup may be called more than once.
func KillGroup(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pgid := cmd.Process.Pid
	if cmd.ProcessState == nil {
		_ = unix.Kill(-pgid, unix.SIGKILL)
		_ = cmd.Wait()
	}
	if !Poll(10*time.Second, func() bool {
		if len(GroupMembers(pgid)) == 0 {
			return true
		}
		_ = unix.Kill(-pgid, unix.SIGKILL)
		return false
	}) {
		t.Errorf("process group %d still has live members after SIGKILL: %v", pgid, GroupMembers(pgid))
	}
}

// GroupMembers lists the PIDs of the live (not zombie) processes in
// process group pgid.
func GroupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		if err == nil && st.PGID == pgid && !st.Zombie() {
			out = append(out, pid)
		}
	}
	return out
}

// Sleep starts `sleep 1000` with attr (may be nil), cleaned up with t.
func Sleep(t testing.TB, attr *syscall.SysProcAttr) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = attr
	return Start(t, cmd)
}

// Exists reports whether root/<pid> exists: a process, a zombie, or a
// thread ID (which /proc answers for although it does not list it).
func Exists(root string, pid int) bool {
	_, err := os.Lstat(root + "/" + strconv.Itoa(pid))
	return err == nil
}

// WaitGone waits until root/<pid> no longer exists.
func WaitGone(t testing.TB, root string, pid int, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, fmt.Sprintf("%s/%d to vanish", root, pid), func() bool { return !Exists(root, pid) })
}

// WaitState waits until the state letter of pid is one of states and
// returns the stat read then.
func WaitState(t testing.TB, root string, pid int, states string, timeout time.Duration) fingerprint.Stat {
	t.Helper()
	var st fingerprint.Stat
	WaitFor(t, timeout, fmt.Sprintf("pid %d to reach state [%s]", pid, states), func() bool {
		s, err := fingerprint.ReadStat(root, pid)
		if err != nil {
			return false
		}
		st = s
		return strings.IndexByte(states, s.State) >= 0
	})
	return st
}

// MustStat reads pid's stat or fails t.
func MustStat(t testing.TB, root string, pid int) fingerprint.Stat {
	t.Helper()
	st, err := fingerprint.ReadStat(root, pid)
	if err != nil {
		t.Fatalf("read stat of %d: %v", pid, err)
	}
	return st
}

// StatusField returns the value of key (e.g. "Tgid", "SigIgn") in
// root/<pid>/status.
func StatusField(root string, pid int, key string) (string, error) {
	data, err := os.ReadFile(root + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", err
	}
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		k, v, ok := bytes.Cut(line, []byte{':'})
		if ok && string(k) == key {
			return string(bytes.TrimSpace(v)), nil
		}
	}
	return "", fmt.Errorf("pid %d: no %s in status", pid, key)
}

// SignalMask reads a hexadecimal signal mask (SigIgn, SigPnd, ShdPnd, ...)
// from root/<pid>/status.
func SignalMask(root string, pid int, key string) (uint64, error) {
	v, err := StatusField(root, pid, key)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v, 16, 64)
}

// HasSignal reports whether mask has sig set.
func HasSignal(mask uint64, sig syscall.Signal) bool {
	return mask&(1<<(uint(sig)-1)) != 0
}

// Thread starts an OS thread of the calling process that lives until t
// ends, and returns its thread ID, which is never the process's PID.
func Thread(t testing.TB) int {
	t.Helper()
	for range 16 {
		tid := make(chan int)
		done := make(chan struct{})
		go func() {
			// Never unlocked: when the goroutine returns, the runtime
			// ends the thread with it.
			runtime.LockOSThread()
			tid <- unix.Gettid()
			<-done
		}()
		n := <-tid
		t.Cleanup(func() { close(done) })
		if n != os.Getpid() {
			return n
		}
		// The goroutine landed on the main thread; keep it parked there
		// and try again.
	}
	t.Fatal("could not start a thread other than the main thread")
	return 0
}

// UptimeTicks returns the time since boot from root/uptime in hundredths
// of a second, the unit (USER_HZ = 100 on Linux) of the start time in
// /proc/<pid>/stat; both count CLOCK_BOOTTIME.
func UptimeTicks(root string) (uint64, error) {
	data, err := os.ReadFile(root + "/uptime")
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
	secs, frac, ok := strings.Cut(first, ".")
	if !ok || len(frac) != 2 {
		return 0, fmt.Errorf("uptime %q: want two decimals", first)
	}
	s, err := strconv.ParseUint(secs, 10, 64)
	if err != nil {
		return 0, err
	}
	c, err := strconv.ParseUint(frac, 10, 64)
	if err != nil {
		return 0, err
	}
	return s*100 + c, nil
}

// WaitTickPast waits until the boot clock, in stat start-time ticks, is
// past ticks: a process started afterwards has a larger start time.
func WaitTickPast(root string, ticks uint64, timeout time.Duration) error {
	var last uint64
	var lastErr error
	if Poll(timeout, func() bool {
		last, lastErr = UptimeTicks(root)
		return lastErr == nil && last > ticks
	}) {
		return nil
	}
	if lastErr != nil {
		return lastErr
	}
	return fmt.Errorf("clock at tick %d, not past %d after %v", last, ticks, timeout)
}

// SetNextPID makes n the next PID (or TID) the kernel hands out in the
// caller's PID namespace, if n is free then: it writes n-1 to
// root/sys/kernel/ns_last_pid. Needs CAP_SYS_ADMIN (or
// CAP_CHECKPOINT_RESTORE) over the namespace.
func SetNextPID(root string, n int) error {
	if n < 2 {
		return errors.New("next pid must be at least 2")
	}
	return os.WriteFile(root+"/sys/kernel/ns_last_pid", []byte(strconv.Itoa(n-1)), 0)
}

// Dead reports whether pid is gone or a zombie (exited, its parent's to
// reap).
func Dead(pid int) bool {
	st, err := fingerprint.ReadStat("/proc", pid)
	return err != nil || st.Zombie()
}

// Running lists the live processes whose command line contains s: what a
// test started by a script path of its own, however often it forked.
func Running(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		id, err := fingerprint.Read("/proc", pid)
		if err == nil && !id.Zombie() && strings.Contains(strings.Join(id.Argv, " "), s) {
			out = append(out, pid)
		}
	}
	return out
}
