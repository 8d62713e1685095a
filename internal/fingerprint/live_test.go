package fingerprint_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const root = fingerprint.DefaultRoot

const waitLong = 10 * time.Second

func TestReadLive(t *testing.T) {
	cmd := proc.Sleep(t, &syscall.SysProcAttr{Setpgid: true})
	pid := cmd.Process.Pid
	// The child is ours from fork on, but comm and argv change at exec,
	// and not at once: the kernel renames the process before it lays out
	// the new argv, which reads empty in between.
	proc.WaitFor(t, waitLong, "sleep to exec", func() bool {
		st, err := fingerprint.ReadStat(root, pid)
		if err != nil || st.Comm != "sleep" {
			return false
		}
		argv, err := fingerprint.ReadArgv(root, pid)
		return err == nil && len(argv) > 0
	})

	id, err := fingerprint.Read(root, pid)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if id.PID != pid || id.TGID != pid || id.PPID != os.Getpid() || id.PGID != pid {
		t.Errorf("Read: pid %d tgid %d ppid %d pgid %d; want %d %d %d %d", id.PID, id.TGID, id.PPID, id.PGID, pid, pid, os.Getpid(), pid)
	}
	if id.UID != os.Getuid() {
		t.Errorf("UID = %d, want %d", id.UID, os.Getuid())
	}
	if want := []string{"sleep", "1000"}; !reflect.DeepEqual(id.Argv, want) {
		t.Errorf("Argv = %q, want %q", id.Argv, want)
	}
	// D: a process just started can wait on a page of its binary.
	if id.State != 'S' && id.State != 'R' && id.State != 'D' {
		t.Errorf("State = %c, want S, R or D", id.State)
	}
	if id.Threads != 1 || id.Zombie() {
		t.Errorf("Threads = %d, Zombie = %v; want 1, false", id.Threads, id.Zombie())
	}
	now, err := proc.UptimeTicks(root)
	if err != nil {
		t.Fatal(err)
	}
	if id.StartTicks == 0 || id.StartTicks > now {
		t.Errorf("StartTicks = %d, uptime %d ticks", id.StartTicks, now)
	}

	again := proc.MustStat(t, root, pid)
	if !fingerprint.Same(id.Stat, again) {
		t.Errorf("two reads of a live process differ: %+v vs %+v", id.Stat, again)
	}
	if !fingerprint.Alive(root, id.Stat) {
		t.Error("Alive = false for a live process")
	}
	st, err := fingerprint.Revalidate(root, id.Stat)
	if err != nil || !fingerprint.Same(st, id.Stat) {
		t.Errorf("Revalidate = %+v, %v", st, err)
	}
}

func TestReadSelf(t *testing.T) {
	id, err := fingerprint.Read(root, os.Getpid())
	if err != nil {
		t.Fatalf("Read(self): %v", err)
	}
	if id.TGID != os.Getpid() || id.Threads < 2 || len(id.Argv) == 0 {
		t.Errorf("Read(self) = tgid %d, %d threads, argv %q", id.TGID, id.Threads, id.Argv)
	}
	if !fingerprint.Alive(root, id.Stat) {
		t.Error("Alive(self) = false")
	}
}

func TestZombieProcess(t *testing.T) {
	cmd := proc.Sleep(t, nil)
	pid := cmd.Process.Pid
	rec := proc.MustStat(t, root, pid)
	// Killed but not waited for: a zombie until the cleanup reaps it.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	proc.WaitState(t, root, pid, "Z", waitLong)

	id, err := fingerprint.Read(root, pid)
	if err != nil {
		t.Fatalf("Read(zombie): %v", err)
	}
	if !id.Zombie() || id.Threads != 1 || len(id.Argv) != 0 || !fingerprint.Same(id.Stat, rec) {
		t.Errorf("Read(zombie) = %+v", id)
	}
	if fingerprint.Alive(root, rec) {
		t.Error("Alive = true for a zombie")
	}
	if _, err := fingerprint.Revalidate(root, rec); err != nil {
		t.Errorf("Revalidate(zombie) = %v; a zombie is still the recorded process", err)
	}
	if p, err := fingerprint.Pin(root, rec); !errors.Is(err, fingerprint.ErrNotFound) {
		if p != nil {
			p.Close()
		}
		t.Errorf("Pin(zombie) = %v, want ErrNotFound", err)
	}
}

func TestVanished(t *testing.T) {
	cmd := proc.Sleep(t, nil)
	pid := cmd.Process.Pid
	rec := proc.MustStat(t, root, pid)
	proc.Reap(cmd)
	proc.WaitGone(t, root, pid, waitLong)

	data, err := os.ReadFile(root + "/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}

	for _, want := range []fingerprint.Stat{rec, {PID: pidMax + 1, StartTicks: 1}} {
		t.Run(strconv.Itoa(want.PID), func(t *testing.T) {
			if _, err := fingerprint.Read(root, want.PID); !errors.Is(err, fingerprint.ErrNotFound) {
				t.Errorf("Read = %v, want ErrNotFound", err)
			}
			if _, err := fingerprint.ReadStat(root, want.PID); !errors.Is(err, fingerprint.ErrNotFound) {
				t.Errorf("ReadStat = %v, want ErrNotFound", err)
			}
			if _, err := fingerprint.ReadArgv(root, want.PID); !errors.Is(err, fingerprint.ErrNotFound) {
				t.Errorf("ReadArgv = %v, want ErrNotFound", err)
			}
			if _, err := fingerprint.Revalidate(root, want); !errors.Is(err, fingerprint.ErrNotFound) {
				t.Errorf("Revalidate = %v, want ErrNotFound", err)
			}
			if fingerprint.Alive(root, want) {
				t.Error("Alive = true")
			}
			if p, err := fingerprint.Pin(root, want); !errors.Is(err, fingerprint.ErrNotFound) {
				if p != nil {
					p.Close()
				}
				t.Errorf("Pin = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestThreadID checks that a thread ID, which /proc answers for although
// it does not list it, is never taken for a process.
func TestThreadID(t *testing.T) {
	inn, err := proc.StartInnocent(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	var other int
	proc.WaitFor(t, waitLong, "a second thread in the helper", func() bool {
		tasks, _ := os.ReadDir(root + "/" + strconv.Itoa(inn.PID) + "/task")
		for _, e := range tasks {
			if n, err := strconv.Atoi(e.Name()); err == nil && n != inn.PID {
				other = n
				return true
			}
		}
		return false
	})

	tests := []struct {
		name string
		tid  int
		tgid int
	}{
		{"thread of this process", proc.Thread(t), os.Getpid()},
		{"thread of another process", other, inn.PID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tgid, err := proc.StatusField(root, tt.tid, "Tgid"); err != nil || tgid != strconv.Itoa(tt.tgid) {
				t.Fatalf("test setup: Tgid of %d = %q, %v; want %d", tt.tid, tgid, err, tt.tgid)
			}
			id, err := fingerprint.Read(root, tt.tid)
			if !errors.Is(err, fingerprint.ErrNotProcess) {
				t.Errorf("Read(tid %d) = %+v, %v; want ErrNotProcess", tt.tid, id, err)
			}
			// ReadStat does not tell threads apart (documented); the
			// identity it returns must still never be alive.
			st, err := fingerprint.ReadStat(root, tt.tid)
			if err != nil {
				t.Fatalf("ReadStat(tid %d): %v", tt.tid, err)
			}
			if st.PID != tt.tid {
				t.Errorf("ReadStat(tid).PID = %d", st.PID)
			}
			if fingerprint.Alive(root, st) {
				t.Errorf("Alive(tid %d) = true", tt.tid)
			}
			if _, err := fingerprint.Revalidate(root, st); !errors.Is(err, fingerprint.ErrNotProcess) {
				t.Errorf("Revalidate(tid) = %v, want ErrNotProcess", err)
			}
			if p, err := fingerprint.Pin(root, st); !errors.Is(err, fingerprint.ErrNotProcess) {
				if p != nil {
					p.Close()
				}
				t.Errorf("Pin(tid) = %v, want ErrNotProcess", err)
			}
		})
	}
	if n, err := inn.Sync(); err != nil || n != 0 {
		t.Errorf("helper caught %d signals (%v): %v", n, inn.Caught(), err)
	}
}

func TestRecycledIdentity(t *testing.T) {
	cmd := proc.Sleep(t, nil)
	live := proc.WaitState(t, root, cmd.Process.Pid, "S", waitLong)
	for _, delta := range []int64{-1, +1} {
		t.Run(strconv.FormatInt(delta, 10), func(t *testing.T) {
			rec := live
			rec.StartTicks = uint64(int64(rec.StartTicks) + delta)
			if fingerprint.Alive(root, rec) {
				t.Error("Alive = true for another start time")
			}
			if _, err := fingerprint.Revalidate(root, rec); !errors.Is(err, fingerprint.ErrRecycled) {
				t.Errorf("Revalidate = %v, want ErrRecycled", err)
			}
			if p, err := fingerprint.Pin(root, rec); !errors.Is(err, fingerprint.ErrRecycled) {
				if p != nil {
					p.Close()
				}
				t.Errorf("Pin = %v, want ErrRecycled", err)
			}
		})
	}
	if st := proc.MustStat(t, root, cmd.Process.Pid); st.State != 'S' || !fingerprint.Alive(root, live) {
		t.Errorf("the live process is in state %c after the refusals", st.State)
	}
}

func TestPin(t *testing.T) {
	cmd := proc.Sleep(t, nil)
	pid := cmd.Process.Pid
	rec := proc.MustStat(t, root, pid)

	p, err := fingerprint.Pin(root, rec)
	if err != nil {
		t.Fatalf("Pin: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	if !fingerprint.Same(p.Stat, rec) || p.Fd() < 0 {
		t.Fatalf("Pin = %+v fd %d", p.Stat, p.Fd())
	}
	if ready := pollFd(t, p.Fd(), 0); ready {
		t.Fatal("pidfd readable while the process runs")
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal(TERM): %v", err)
	}
	if !pollFd(t, p.Fd(), waitLong) {
		t.Fatal("pidfd not readable after the process was killed")
	}
	proc.WaitState(t, root, pid, "Z", waitLong)
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("process ended with %v, want SIGTERM", err)
	}
	// Reaped: its number may be reused, the pidfd still names the dead one.
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, fingerprint.ErrNotFound) {
		t.Errorf("Signal after reaping = %v, want ErrNotFound", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// pollFd reports whether fd becomes readable within timeout.
func pollFd(t *testing.T, fd int, timeout time.Duration) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(timeout.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		return n > 0
	}
}

// TestZombieLeader: when the main thread of a multi-threaded process exits,
// /proc shows its leader in state Z although the process runs on. It must
// count as alive until the whole process has exited.
func TestZombieLeader(t *testing.T) {
	z, err := proc.StartZombieLeader(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Reap(z.Cmd) })

	st := proc.MustStat(t, root, z.PID)
	if st.State != 'Z' || st.Threads < 2 {
		t.Fatalf("test setup: leader state %c with %d threads", st.State, st.Threads)
	}
	if st.Zombie() {
		t.Error("Zombie() = true for a process with live threads")
	}
	if !fingerprint.Alive(root, st) {
		t.Error("Alive = false for a process with live threads")
	}
	id, err := fingerprint.Read(root, z.PID)
	if err != nil || id.TGID != z.PID {
		t.Errorf("Read = %+v, %v", id, err)
	}
	p, err := fingerprint.Pin(root, st)
	if err != nil {
		t.Fatalf("Pin: %v", err)
	}
	defer p.Close()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("Signal(KILL): %v", err)
	}
	proc.WaitFor(t, waitLong, "the whole process to exit", func() bool {
		s, err := fingerprint.ReadStat(root, z.PID)
		return err == nil && s.Zombie()
	})
	if fingerprint.Alive(root, st) {
		t.Error("Alive = true after the process exited")
	}
}

// TestReadRefusesAHugeArgv: a process may make its argv as large as it
// likes; past MaxFile it is not read (ErrTooLarge), whether through Dir
// or the scan's reader, and one just under it is.
func TestReadRefusesAHugeArgv(t *testing.T) {
	arg := strings.Repeat("x", 100<<10) // under execve's 128 KiB a string
	for _, tc := range []struct {
		name string
		args int
		want error
	}{
		{"just under", fingerprint.MaxFile/len(arg) - 1, nil},
		{"past it", fingerprint.MaxFile/len(arg) + 2, fingerprint.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := []string{"1000000"}
			for range tc.args {
				argv = append(argv, arg)
			}
			// sh keeps them as its positional parameters while it waits
			// on its stdin, held open.
			cmd := exec.Command("/bin/sh", append([]string{"-c", "read x", "sh"}, argv...)...)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { stdin.Close() })
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
			})
			pid := cmd.Process.Pid
			deadline := time.Now().Add(waitLong)
			// execve names the process before it sets its argv up: wait
			// for the argv, or for it to be too large.
			for {
				data, err := fingerprint.ReadCapped(root + "/" + strconv.Itoa(pid) + "/cmdline")
				if errors.Is(err, fingerprint.ErrTooLarge) || bytes.HasPrefix(data, []byte("/bin/sh\x00")) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sh did not start: %q, %v", data[:min(len(data), 64)], err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			r := proctable.NewReader(root)
			defer r.Close()
			for name, read := range map[string]func() (fingerprint.Identity, error){
				"Read":   func() (fingerprint.Identity, error) { return fingerprint.Read(root, pid) },
				"Reader": func() (fingerprint.Identity, error) { return r.Identity(pid) },
			} {
				id, err := read()
				if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Errorf("%s: %v, want %v", name, err, tc.want)
				}
				if err == nil && len(id.Argv) != len(argv)+4 {
					t.Errorf("%s: %d arguments, want %d", name, len(id.Argv), len(argv)+4)
				}
			}
		})
	}
}
