package proc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// mapEnv names the file a mapped-argv helper maps over its argv.
const mapEnv = "KC_TESTKIT_PROC_MAP"

// mappedArgvMain maps the file $KC_TESTKIT_PROC_MAP over the whole pages
// its argv strings fill, as a user can to make /proc/<pid>/cmdline read
// from a file of his choosing, then says "ready" and waits for stdin to
// close. Nothing after the mapping may touch os.Args or the environment:
// their strings live in those pages.
func mappedArgvMain() int {
	file := os.Getenv(mapEnv)
	if !setComm("mapped-argv") {
		return 3
	}
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		fmt.Fprintf(os.Stderr, "mapped-argv: %v\n", err)
		return 3
	}
	// Fields after the comm's ")" start at field 3; arg_start and arg_end
	// are fields 48 and 49.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 47 {
		fmt.Fprintf(os.Stderr, "mapped-argv: short stat %q\n", stat)
		return 3
	}
	start, err1 := strconv.ParseUint(f[45], 10, 64)
	end, err2 := strconv.ParseUint(f[46], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(os.Stderr, "mapped-argv: %v\n", err)
		return 3
	}
	page := uint64(os.Getpagesize())
	lo, hi := (start+page-1)&^(page-1), end&^(page-1)
	if hi <= lo {
		fmt.Fprintf(os.Stderr, "mapped-argv: argv %#x-%#x fills no whole page\n", start, end)
		return 3
	}
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mapped-argv: %v\n", err)
		return 3
	}
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(lo), uintptr(hi-lo), unix.PROT_READ,
		unix.MAP_PRIVATE|unix.MAP_FIXED, uintptr(fd), 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "mapped-argv: mmap: %v\n", errno)
		return 3
	}
	fmt.Fprintln(os.Stdout, "ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// Mapping is a helper process that maps a file: a mapped-argv or a
// lock-holder.
type Mapping struct {
	Cmd *exec.Cmd
	PID int
	in  io.WriteCloser
	out *bufio.Reader
}

// StartMappedArgv starts a mapped-argv helper named comm (at most 15
// bytes) with attr (may be nil) that maps file over its argv, which ends
// with args after a padding argument long enough to fill whole pages, and
// waits until it is mapped. The caller must Close it.
func StartMappedArgv(attr *syscall.SysProcAttr, file, comm string, args ...string) (*Mapping, error) {
	return startMapping(modeMappedArgv, attr, file, comm, append([]string{"--pad=" + strings.Repeat("x", 3*os.Getpagesize())}, args...))
}

// StartLockHolder starts a lock-holder helper named comm (if not empty)
// with args at the end of its argv, mapping file, and waits until it has.
// Do makes it fault on the mapping and then map memory.
func StartLockHolder(attr *syscall.SysProcAttr, file, comm string, args ...string) (*Mapping, error) {
	return startMapping(modeLockHolder, attr, file, comm, args)
}

func startMapping(mode string, attr *syscall.SysProcAttr, file, comm string, args []string) (*Mapping, error) {
	cmd, in, out, err := startHelper(mode, attr, []string{mapEnv + "=" + file, commEnv + "=" + comm}, args)
	if err != nil {
		return nil, err
	}
	m := &Mapping{Cmd: cmd, PID: cmd.Process.Pid, in: in, out: bufio.NewReader(out)}
	if line, err := readLine(m.out, 10*time.Second); err != nil || line != "ready" {
		m.Close()
		return nil, fmt.Errorf("%s helper: got %q, %v", mode, line, err)
	}
	return m, nil
}

// Do sends a lock-holder a command ("fault" or "mmap").
func (m *Mapping) Do(cmd string) error {
	_, err := io.WriteString(m.in, cmd+"\n")
	return err
}

// Mapped reports whether a lock-holder said "mapped" within timeout: its
// anonymous mapping got the memory map's lock.
func (m *Mapping) Mapped(timeout time.Duration) bool {
	line, err := readLine(m.out, timeout)
	return err == nil && line == "mapped"
}

// Close kills and reaps the helper. A helper waiting on a FUSE server
// may not die until the server's connection is aborted.
func (m *Mapping) Close() {
	m.in.Close()
	Reap(m.Cmd)
}

// HoldMemoryLock starts a lock-holder named comm with args, over a file
// of a FUSE server that fails the first read and never answers another
// (testutil.ServeStalledFile), and has it fault on the file and then map
// memory: held says the fault holds the memory map's lock, so that every
// reader of the helper's cmdline waits. Cleanup aborts the server, then
// kills the helper.
func HoldMemoryLock(t testing.TB, comm string, args ...string) (m *Mapping, held bool) {
	t.Helper()
	return HoldMemoryLockIn(t, &syscall.SysProcAttr{Setpgid: true}, comm, args...)
}

// HoldMemoryLockIn is HoldMemoryLock with the helper started with attr
// (to put it in another process's group, say).
func HoldMemoryLockIn(t testing.TB, attr *syscall.SysProcAttr, comm string, args ...string) (m *Mapping, held bool) {
	t.Helper()
	f := testutil.ServeStalledFile(t, t.TempDir(), "fuse")
	m, err := StartLockHolder(attr, f.Path, comm, args...)
	if err != nil {
		t.Fatal(err)
	}
	// The helper can be killed only once the connection is gone, and
	// reads of its memory given up on end then too.
	t.Cleanup(func() { f.Abort(); m.Close() })
	if err := m.Do("fault"); err != nil {
		t.Fatal(err)
	}
	// The first read fails; the retried fault's read is the one that
	// holds the lock.
	WaitFor(t, 10*time.Second, "the retried fault's read at the server", func() bool { return f.Reads() > 1 })
	if err := m.Do("mmap"); err != nil {
		t.Fatal(err)
	}
	return m, !m.Mapped(2 * time.Second)
}

// faulted keeps the lock holder's read of its mapping from being
// optimised away.
var faulted atomic.Uint32

// lockHolderMain maps $KC_TESTKIT_PROC_MAP, says "ready", and then on
// stdin's "fault" reads the mapping's first byte on a thread of its own
// (which waits on the file's server), and on "mmap" maps anonymous memory
// on another and says "mapped" (which waits for the memory map's lock
// while the first holds it).
func lockHolderMain() int {
	if !setComm("lock-holder") {
		return 3
	}
	fd, err := unix.Open(os.Getenv(mapEnv), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lock-holder: %v\n", err)
		return 3
	}
	m, err := unix.Mmap(fd, 0, 1<<16, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lock-holder: mmap: %v\n", err)
		return 3
	}
	fmt.Fprintln(os.Stdout, "ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "fault":
			go func() {
				runtime.LockOSThread()
				faulted.Store(uint32(m[0])) // a load the compiler keeps
			}()
		case "mmap":
			go func() {
				runtime.LockOSThread()
				if _, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err == nil {
					fmt.Fprintln(os.Stdout, "mapped")
				}
			}()
		}
	}
	return 0
}

// setComm names this process $KC_TESTKIT_PROC_COMM, if set. /proc/self/comm
// names the thread-group leader, which is what /proc/<pid>/comm and stat
// show; prctl(PR_SET_NAME) would name whichever thread this goroutine
// happens to run on.
func setComm(who string) bool {
	c := os.Getenv(commEnv)
	if c == "" {
		return true
	}
	if err := os.WriteFile("/proc/self/comm", []byte(c), 0); err != nil {
		fmt.Fprintf(os.Stderr, "%s: set comm: %v\n", who, err)
		return false
	}
	return true
}
