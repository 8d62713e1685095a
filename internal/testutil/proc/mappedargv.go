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
	"time"

	"golang.org/x/sys/unix"
)

// mapEnv names the file a mapped-argv helper maps over its argv.
const mapEnv = "KC_TESTKIT_PROC_MAP"

// mappedArgvMain maps the file $KC_TESTKIT_PROC_MAP over the whole pages
// its argv strings fill, as a user can to make /proc/<pid>/cmdline read
// from a file of his choosing, then says "ready" and waits for stdin to
// close. Nothing after the mapping may touch os.Args or the environment:
// their strings live in those pages.
func mappedArgvMain() int {
	file, comm := os.Getenv(mapEnv), os.Getenv(commEnv)
	if comm != "" {
		if err := os.WriteFile("/proc/self/comm", []byte(comm), 0); err != nil {
			fmt.Fprintf(os.Stderr, "mapped-argv: set comm: %v\n", err)
			return 3
		}
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

// MappedArgv is a process whose argv, from its second page on, is a
// mapping of a file: reading its /proc/<pid>/cmdline reads that file.
type MappedArgv struct {
	Cmd *exec.Cmd
	PID int
	in  io.Closer
}

// StartMappedArgv starts a mapped-argv helper named comm (at most 15
// bytes) with attr (may be nil) that maps file over its argv, which ends
// with args after a padding argument long enough to fill whole pages, and
// waits until it is mapped. The caller must Close it.
func StartMappedArgv(attr *syscall.SysProcAttr, file, comm string, args ...string) (*MappedArgv, error) {
	cmd, err := helperCommand(modeMappedArgv)
	if err != nil {
		return nil, err
	}
	cmd.Args = append(cmd.Args, "--pad="+strings.Repeat("x", 3*os.Getpagesize()))
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(cmd.Env, mapEnv+"="+file, commEnv+"="+comm)
	cmd.SysProcAttr = attr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &MappedArgv{Cmd: cmd, PID: cmd.Process.Pid, in: in}
	if line, err := readLine(out, 10*time.Second); err != nil || line != "ready" {
		m.Close()
		return nil, fmt.Errorf("mapped-argv helper: got %q, %v", line, err)
	}
	return m, nil
}

// Close kills and reaps the helper.
func (m *MappedArgv) Close() {
	m.in.Close()
	Reap(m.Cmd)
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
	if comm := os.Getenv(commEnv); comm != "" {
		if err := os.WriteFile("/proc/self/comm", []byte(comm), 0); err != nil {
			fmt.Fprintf(os.Stderr, "lock-holder: set comm: %v\n", err)
			return 3
		}
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

// LockHolder is a lock-holder helper: see StartLockHolder.
type LockHolder struct {
	Cmd *exec.Cmd
	PID int
	in  io.WriteCloser
	out *bufio.Reader
}

// StartLockHolder starts a lock-holder helper named comm (if not empty)
// with args at the end of its argv, mapping file, and waits until it has.
func StartLockHolder(attr *syscall.SysProcAttr, file, comm string, args ...string) (*LockHolder, error) {
	cmd, err := helperCommand(modeLockHolder)
	if err != nil {
		return nil, err
	}
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(cmd.Env, mapEnv+"="+file, commEnv+"="+comm)
	cmd.SysProcAttr = attr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &LockHolder{Cmd: cmd, PID: cmd.Process.Pid, in: in, out: bufio.NewReader(out)}
	if line, err := readLine(h.out, 10*time.Second); err != nil || line != "ready" {
		h.Close()
		return nil, fmt.Errorf("lock-holder helper: got %q, %v", line, err)
	}
	return h, nil
}

// Do sends the helper a command ("fault" or "mmap").
func (h *LockHolder) Do(cmd string) error {
	_, err := io.WriteString(h.in, cmd+"\n")
	return err
}

// Mapped reports whether the helper said "mapped" within timeout: its
// anonymous mapping got the memory map's lock.
func (h *LockHolder) Mapped(timeout time.Duration) bool {
	line, err := readLine(h.out, timeout)
	return err == nil && line == "mapped"
}

// Close kills and reaps the helper. A helper waiting on a FUSE server
// may not die until the server's connection is aborted.
func (h *LockHolder) Close() {
	h.in.Close()
	Reap(h.Cmd)
}
