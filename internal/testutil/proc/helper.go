package proc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// helperEnv selects a helper mode of the test binary; see Main. commEnv,
// when set, is the comm an innocent gives itself before it reports ready.
const (
	helperEnv = "KC_TESTKIT_PROC_HELPER"
	commEnv   = "KC_TESTKIT_PROC_COMM"
)

const (
	modeInnocent     = "innocent"
	modeZombieLeader = "zombie-leader"
	modeMappedArgv   = "mapped-argv"
	modeLockHolder   = "lock-holder"
)

func init() {
	// Only an init function can keep the main goroutine on the main
	// thread, which the zombie-leader helper needs to end.
	if os.Getenv(helperEnv) == modeZombieLeader {
		runtime.LockOSThread()
	}
}

// Main runs the helper mode named in the environment, if any, and exits.
// It returns at once in an ordinary test run. Call it first in TestMain.
func Main() {
	mode := os.Getenv(helperEnv)
	switch mode {
	case "":
		return
	case modeInnocent:
		os.Exit(innocentMain())
	case modeZombieLeader:
		os.Exit(zombieLeaderMain())
	case modeMappedArgv:
		os.Exit(mappedArgvMain())
	case modeLockHolder:
		os.Exit(lockHolderMain())
	}
	fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, mode)
	os.Exit(2)
}

// helperCommand returns a command running this test binary in mode. The
// -test.run=^$ argument makes a binary whose TestMain does not call Main
// run no tests, so the helper fails to start instead of recursing.
func helperCommand(mode string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stderr = os.Stderr
	return cmd, nil
}

// startHelper starts this test binary in mode with attr, env added to
// its environment and args to its argv, its stdin and stdout piped.
func startHelper(mode string, attr *syscall.SysProcAttr, env, args []string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	cmd, err := helperCommand(mode)
	if err != nil {
		return nil, nil, nil, err
	}
	cmd.Args = append(cmd.Args, args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = attr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, in, out, nil
}

// watched are the signals an innocent catches and reports. SIGURG is left
// out (the Go runtime uses it to preempt goroutines), and so are SIGCHLD and
// SIGPROF. SIGSTOP and SIGKILL cannot be caught; a SIGSTOP shows as state T
// or, once continued, as a caught SIGCONT; a SIGKILL as death.
var watched = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1,
	syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTERM,
	syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
	syscall.SIGWINCH,
}

// sentinel is what an innocent sends itself to flush its signal queue. The
// runtime hands a batch of pending signals to os/signal in ascending number
// order, so a sentinel numbered above every watched signal arrives after
// any watched signal that was queued before it.
const sentinel = syscall.SIGPWR

// innocentMain is a bystander process: it names itself $KC_TESTKIT_PROC_COMM
// (if set), reports every signal it catches, answers "sync" with the number
// caught so far, on "pgid N" joins process group N, and on "thread N
// [COMM]" starts OS threads until one has thread ID N, which it names COMM.
func innocentMain() int {
	if !setComm("innocent") {
		return 3
	}
	var (
		outMu sync.Mutex
		mu    sync.Mutex
		count int
	)
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	c := make(chan os.Signal, 1024)
	signal.Notify(c, append(watched[:len(watched):len(watched)], sentinel)...)
	synced := make(chan int, 1)
	go func() {
		for s := range c {
			if s == sentinel {
				mu.Lock()
				n := count
				mu.Unlock()
				synced <- n
				continue
			}
			mu.Lock()
			count++
			mu.Unlock()
			say("sig %s", unix.SignalName(s.(syscall.Signal)))
		}
	}()
	say("ready %d", os.Getpid())

	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := ""
		if len(f) > 1 {
			arg = f[1]
		}
		switch f[0] {
		case "sync":
			// Twice: a signal another thread took just before the first
			// sentinel may still be on its way into os/signal when the
			// sentinel, taken by this one, overtakes it.
			n, err := -1, error(nil)
			for range 2 {
				if err = unix.Kill(os.Getpid(), sentinel); err != nil {
					break
				}
				select {
				case n = <-synced:
				case <-time.After(10 * time.Second):
					err = errors.New("sentinel lost")
				}
				if err != nil {
					break
				}
			}
			if err != nil {
				say("error %v", err)
				continue
			}
			say("sync %d", n)
		case "pgid":
			// Join process group f[1] (or lead a new one with 0).
			pgid, err := strconv.Atoi(arg)
			if err == nil {
				err = unix.Setpgid(0, pgid)
			}
			if err != nil {
				say("error setpgid: %v", err)
				continue
			}
			say("pgid ok")
		case "thread":
			n, err := strconv.Atoi(arg)
			if err != nil {
				say("error %v", err)
				continue
			}
			comm := ""
			if len(f) > 2 {
				comm = f[2]
			}
			say("%s", threadAt(n, comm))
		default:
			say("error unknown command %q", f[0])
		}
	}
	return 0
}

// threadAt starts OS threads, one at a time, until this process has a
// thread with ID n, names it comm (when given), and parks the threads for
// the rest of its life. Each thread is held by a goroutine locked to it;
// once every idle thread is held the runtime must create a new one to go
// on running this goroutine.
func threadAt(n int, comm string) string {
	path := "/proc/self/task/" + strconv.Itoa(n)
	ok := func(started int) string {
		if comm != "" {
			if err := os.WriteFile(path+"/comm", []byte(comm), 0); err != nil {
				return "thread fail: comm: " + err.Error()
			}
		}
		return fmt.Sprintf("thread ok %d", started)
	}
	forever := make(chan struct{})
	for i := range 64 {
		if _, err := os.Lstat(path); err == nil {
			return ok(i)
		}
		got := make(chan int)
		go func() {
			runtime.LockOSThread()
			got <- unix.Gettid()
			<-forever
		}()
		if <-got == n {
			return ok(i + 1)
		}
	}
	if _, err := os.Lstat(path); err == nil {
		return ok(64)
	}
	return "thread fail"
}

// zombieLeaderMain ends its main thread, and only that thread: the
// thread-group leader becomes a zombie (state Z in /proc/<pid>/stat) while
// the process lives on in its other threads until it is killed.
func zombieLeaderMain() int {
	if unix.Gettid() != os.Getpid() {
		fmt.Fprintln(os.Stderr, "zombie-leader: main goroutine is not on the main thread")
		return 3
	}
	// Nothing may stop the world once the main thread, which holds a P,
	// is gone: it would wait for that P forever.
	debug.SetGCPercent(-1)
	runtime.GOMAXPROCS(2)
	ready := make(chan struct{})
	go func() {
		runtime.LockOSThread() // a second thread of our own, for certain
		close(ready)
		select {}
	}()
	<-ready
	fmt.Fprintf(os.Stdout, "ready %d\n", os.Getpid())
	unix.RawSyscall(unix.SYS_EXIT, 0, 0, 0)
	panic("SYS_exit returned")
}

// ZombieLeader is a process whose thread-group leader has exited while its
// other threads run: a live process that /proc shows in state Z.
type ZombieLeader struct {
	Cmd *exec.Cmd
	PID int
}

// StartZombieLeader starts the zombie-leader helper with attr and waits
// until its leader thread shows state Z. Close it with Reap(z.Cmd).
func StartZombieLeader(attr *syscall.SysProcAttr) (*ZombieLeader, error) {
	cmd, err := helperCommand(modeZombieLeader)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = attr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	z := &ZombieLeader{Cmd: cmd, PID: cmd.Process.Pid}
	line, err := readLine(out, 10*time.Second)
	if err != nil || line != fmt.Sprintf("ready %d", z.PID) {
		Reap(cmd)
		return nil, fmt.Errorf("zombie-leader helper: got %q, %v", line, err)
	}
	if !Poll(10*time.Second, func() bool {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(z.PID) + "/stat")
		return err == nil && strings.Contains(string(st), ") Z ")
	}) {
		Reap(cmd)
		return nil, errors.New("zombie-leader helper: leader never showed state Z")
	}
	return z, nil
}

func readLine(r io.Reader, timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := bufio.NewReader(r).ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(timeout):
		return "", errors.New("timed out reading from helper")
	}
}

// Innocent is a bystander helper process that counts the signals it
// receives. Tests use it to prove that nothing was sent to a process that
// took over a recorded PID or process group.
type Innocent struct {
	Cmd  *exec.Cmd
	PID  int
	Stat fingerprint.Stat // its identity once it was ready

	in      io.WriteCloser
	replies chan string

	mu     sync.Mutex
	caught []string

	reap      bool
	done      chan struct{} // closed once the innocent has been reaped
	closeOnce sync.Once
}

// InnocentOptions are the less common settings of an innocent.
type InnocentOptions struct {
	// Comm, if set, is the comm (at most 15 bytes) the innocent gives
	// itself before it reports ready.
	Comm string
	// Reap makes the innocent be reaped the moment it exits, so Dead
	// tells whether it died; by default it is reaped only by Close, and
	// its PID stays taken until then.
	Reap bool
}

// innocentTimeout bounds starting an innocent and its answer to a sync.
const innocentTimeout = 15 * time.Second

// StartInnocent starts an innocent with attr (may be nil) and waits until
// it catches signals. The caller must Close it.
func StartInnocent(attr *syscall.SysProcAttr) (*Innocent, error) {
	return StartInnocentWith(attr, InnocentOptions{})
}

// StartInnocentWith is StartInnocent with options.
func StartInnocentWith(attr *syscall.SysProcAttr, opt InnocentOptions) (*Innocent, error) {
	if len(opt.Comm) > 15 || strings.ContainsAny(opt.Comm, " \t\n") {
		return nil, fmt.Errorf("innocent: bad comm %q", opt.Comm)
	}
	cmd, in, out, err := startHelper(modeInnocent, attr, []string{commEnv + "=" + opt.Comm}, nil)
	if err != nil {
		return nil, err
	}
	i := &Innocent{Cmd: cmd, PID: cmd.Process.Pid, in: in, replies: make(chan string, 16),
		reap: opt.Reap, done: make(chan struct{})}
	if opt.Reap {
		// Wait closes stdout, so it must wait until reading is over.
		go func() { i.read(out); _ = cmd.Wait(); close(i.done) }()
	} else {
		go i.read(out)
	}
	if _, err := i.reply(innocentTimeout); err != nil {
		i.Close()
		return nil, fmt.Errorf("innocent %d did not start: %w", i.PID, err)
	}
	if i.Stat, err = fingerprint.ReadStat("/proc", i.PID); err != nil {
		i.Close()
		return nil, err
	}
	return i, nil
}

func (i *Innocent) read(out io.Reader) {
	defer close(i.replies)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "sig "); ok {
			i.mu.Lock()
			i.caught = append(i.caught, name)
			i.mu.Unlock()
			continue
		}
		i.replies <- line
	}
}

func (i *Innocent) reply(timeout time.Duration) (string, error) {
	select {
	case line, ok := <-i.replies:
		if !ok {
			return "", errors.New("innocent exited")
		}
		if strings.HasPrefix(line, "error ") {
			return "", errors.New(line)
		}
		return line, nil
	case <-time.After(timeout):
		return "", errors.New("innocent did not answer")
	}
}

func (i *Innocent) command(cmd string, timeout time.Duration) (string, error) {
	if _, err := io.WriteString(i.in, cmd+"\n"); err != nil {
		return "", err
	}
	return i.reply(timeout)
}

// Sync returns the number of signals the innocent has caught so far,
// counting every signal that was queued to it before the call. A stopped
// or dead innocent makes it fail.
func (i *Innocent) Sync() (int, error) {
	line, err := i.command("sync", innocentTimeout)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(line, "sync "))
	if err != nil {
		return 0, fmt.Errorf("innocent: bad reply %q", line)
	}
	return n, nil
}

// Caught returns the names of the signals reported so far.
func (i *Innocent) Caught() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]string(nil), i.caught...)
}

// Setpgid moves the innocent into process group pgid (0: a new group it
// leads).
func (i *Innocent) Setpgid(pgid int) error {
	_, err := i.command("pgid "+strconv.Itoa(pgid), 5*time.Second)
	return err
}

// ThreadAt asks the innocent to start threads until one has thread ID n;
// call SetNextPID(n) first. It fails when another task took n.
func (i *Innocent) ThreadAt(n int) error {
	return i.NamedThreadAt(n, "")
}

// NamedThreadAt is ThreadAt that also names the thread comm (no blanks, at
// most 15 bytes; "" leaves the name the thread was born with).
func (i *Innocent) NamedThreadAt(n int, comm string) error {
	if len(comm) > 15 || strings.ContainsAny(comm, " \t\n") {
		return fmt.Errorf("innocent: bad thread comm %q", comm)
	}
	line, err := i.command(strings.TrimSpace("thread "+strconv.Itoa(n)+" "+comm), 10*time.Second)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "thread ok") {
		return fmt.Errorf("innocent %d: no thread %d: %s", i.PID, n, line)
	}
	return nil
}

// Done is closed once the innocent has been reaped.
func (i *Innocent) Done() <-chan struct{} { return i.done }

// Dead reports whether the innocent has exited and been reaped: by
// Close, or (with InnocentOptions.Reap) the moment it exited.
func (i *Innocent) Dead() bool {
	select {
	case <-i.done:
		return true
	default:
		return false
	}
}

// Harm returns how many signals reached the innocent — every signal it
// caught, or one for being dead, replaced or stopped — and says what
// happened; 0 and "" when nothing did.
func (i *Innocent) Harm() (int, string) {
	if i.Dead() {
		return 1, fmt.Sprintf("innocent %d died", i.PID)
	}
	st, err := fingerprint.ReadStat("/proc", i.PID)
	if err != nil || st.StartTicks != i.Stat.StartTicks {
		return 1, fmt.Sprintf("innocent %d gone or replaced (%v)", i.PID, err)
	}
	if st.Zombie() {
		return 1, fmt.Sprintf("innocent %d died", i.PID)
	}
	if st.State == 'T' || st.State == 't' {
		return 1, fmt.Sprintf("innocent %d stopped", i.PID)
	}
	n, err := i.Sync()
	if err != nil {
		return 1, fmt.Sprintf("innocent %d: %v", i.PID, err)
	}
	if n > 0 {
		return n, fmt.Sprintf("innocent %d caught %v", i.PID, i.Caught())
	}
	return 0, ""
}

// Close kills and reaps the innocent. It may be called more than once.
func (i *Innocent) Close() {
	if i.reap {
		_ = i.Cmd.Process.Kill()
		<-i.done
		return
	}
	Reap(i.Cmd)
	i.closeOnce.Do(func() { close(i.done) })
}
