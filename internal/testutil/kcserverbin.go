package testutil

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// KCServerPackage is the import path of the fake supervisor.
const KCServerPackage = "github.com/kc-watchman/kc-watchman/internal/testutil/kcserver"

// BuildKCServer builds the fake supervisor (package ./kcserver) as a
// binary named exactly "kcserver", so that the processes it runs have comm
// "kcserver" (see Build).
func BuildKCServer(t testing.TB) string {
	t.Helper()
	return Build(t, KCServerPackage, "kcserver")
}

// Fake says how StartKCServer runs the fake supervisor: real kcserver
// flags in Args, the fake's test knobs (KCFAKE_*, see ./kcserver) in the
// other fields.
type Fake struct {
	// Args are more kcserver flags, after "--transport=socket" and (when
	// StartKCServer's dir is not empty) "--socket-dir=<dir>".
	Args []string
	// Env is added to the fake's environment (e.g. XDG_RUNTIME_DIR=…).
	Env []string
	// ContainerID, when set, runs the fake the way kc-hook runs a
	// supervisor: as the command of a `kc-hook supervise <ContainerID>
	// <init> …` wrapper that leads the group and carries the ID in its
	// argv (kcserver has no container-ID flag). The wrapper's "init" is
	// InitPID, or a sleep the test starts and owns.
	ContainerID string
	InitPID     int

	Children     int           // KCFAKE_CHILDREN
	Stubborn     bool          // KCFAKE_STUBBORN_CHILD
	SetsidChild  bool          // KCFAKE_SETSID_CHILD
	DaemonChild  bool          // KCFAKE_DAEMON_CHILD: see KCServer.Daemon
	Sessions     string        // KCFAKE_SESSIONS (a JSON file)
	OpenChannels bool          // KCFAKE_OPEN_CHANNELS: make session sockets
	Hang         bool          // KCFAKE_HANG
	Delay        time.Duration // KCFAKE_DELAY
	Comm         string        // KCFAKE_COMM
	IgnoreTerm   bool          // KCFAKE_IGNORE_TERM
	IdleCheck    time.Duration // KCFAKE_IDLE_CHECK

	raw bool // Args are the whole command line (for testutil's own tests)
}

// Environ returns the KCFAKE_* variables for f's knobs, plus f.Env.
func (f Fake) Environ() []string {
	var env []string
	add := func(ok bool, kv string) {
		if ok {
			env = append(env, kv)
		}
	}
	add(f.Children > 0, "KCFAKE_CHILDREN="+strconv.Itoa(f.Children))
	add(f.Stubborn, "KCFAKE_STUBBORN_CHILD=1")
	add(f.SetsidChild, "KCFAKE_SETSID_CHILD=1")
	add(f.DaemonChild, "KCFAKE_DAEMON_CHILD=1")
	add(f.Sessions != "", "KCFAKE_SESSIONS="+f.Sessions)
	add(f.OpenChannels, "KCFAKE_OPEN_CHANNELS=1")
	add(f.Hang, "KCFAKE_HANG=1")
	add(f.Delay > 0, "KCFAKE_DELAY="+f.Delay.String())
	add(f.Comm != "", "KCFAKE_COMM="+f.Comm)
	add(f.IgnoreTerm, "KCFAKE_IGNORE_TERM=1")
	add(f.IdleCheck > 0, "KCFAKE_IDLE_CHECK="+f.IdleCheck.String())
	return append(env, f.Env...)
}

// KCServer is a running fake supervisor started by StartKCServer.
type KCServer struct {
	PID    int    // the fake's pid
	PGID   int    // its process group: its own, or its wrapper's
	Dir    string // its --socket-dir ("" if none was given)
	Socket string // its control socket, as it reported it
	// Cmd is the process StartKCServer started: the fake, or its
	// kc-hook supervise wrapper when Fake.ContainerID was set.
	Cmd *exec.Cmd
	// Children are the identities of the fake's direct children, read once
	// it was ready.
	Children []fingerprint.Stat
	// Daemon is the double-forked child of Fake.DaemonChild (zero
	// without it); cleanup kills it while it is still this process.
	Daemon fingerprint.Stat

	self   fingerprint.Stat
	exited chan struct{}
	stderr *lockedBuffer
	mu     sync.Mutex
	err    error
}

// Stderr returns what the fake (or its wrapper) has written to stderr so
// far.
func (k *KCServer) Stderr() string { return k.stderr.String() }

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartKCServer builds (once) and starts the fake with
// "--transport=socket", "--socket-dir=<dir>" (unless dir is empty) and
// f.Args, and waits until it listens. Started directly, it is made a
// session leader by its launcher (this function), as Positron's or
// kc-hook's launch would; with f.ContainerID it runs under kc-hook
// supervise. Cleanup SIGKILLs the fake, its wrapper and each recorded
// child (after re-checking their identity) unless already gone.
func StartKCServer(t testing.TB, dir string, f Fake) *KCServer {
	t.Helper()
	bin := BuildKCServer(t)
	ready := filepath.Join(t.TempDir(), "ready")
	argv := []string{bin}
	if !f.raw {
		argv = append(argv, "--transport=socket")
	}
	if dir != "" {
		argv = append(argv, "--socket-dir="+dir)
	}
	argv = append(argv, f.Args...)
	env := append(append(os.Environ(), "KCFAKE_READY_FILE="+ready), f.Environ()...)

	var cmd *exec.Cmd
	if f.ContainerID != "" {
		init := f.InitPID
		if init == 0 {
			init = startInit(t)
		}
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, init)
		if err != nil {
			t.Fatalf("init stand-in %d: %v", init, err)
		}
		hook := Build(t, KCHookPackage, "kc-hook")
		wrap := []string{"supervise", "--state-dir=", "--max-restarts=0", "--kill-grace=2s",
			f.ContainerID, strconv.Itoa(init), strconv.FormatUint(st.StartTicks, 10), "--"}
		cmd = exec.Command(hook, append(wrap, argv...)...)
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	cmd.Env = env
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fake kcserver: %v", err)
	}
	k := &KCServer{PGID: cmd.Process.Pid, Dir: dir, Cmd: cmd, exited: make(chan struct{}), stderr: stderr}
	go func() {
		err := cmd.Wait()
		k.mu.Lock()
		k.err = err
		k.mu.Unlock()
		close(k.exited)
	}()
	if f.ContainerID != "" {
		// Runs after k.cleanup (last registered, first run): the
		// wrapper is dead, and its cgroup is left to remove.
		t.Cleanup(func() { RemoveContainCgroups(t, f.ContainerID) })
	}
	t.Cleanup(k.cleanup)

	deadline := time.Now().Add(30 * time.Second)
	var err error
	for {
		if pid, sock, daemon, ok := readReady(ready); ok {
			k.PID, k.Socket = pid, sock
			if daemon > 0 {
				if k.Daemon, err = fingerprint.ReadStat(fingerprint.DefaultRoot, daemon); err != nil {
					t.Fatalf("fake kcserver's daemon %d: %v", daemon, err)
				}
			}
			break
		}
		select {
		case <-k.exited:
			t.Fatalf("fake kcserver exited before it was ready: %v: %s", k.exitErr(), stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake kcserver not ready after 30s: %s", stderr.String())
		}
	}
	if k.PID != cmd.Process.Pid && f.ContainerID == "" {
		t.Fatalf("ready file names pid %d, not the fake's %d", k.PID, cmd.Process.Pid)
	}
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, k.PID)
	if err != nil {
		t.Fatalf("fake kcserver %d: %v", k.PID, err)
	}
	k.self = st
	k.Children = childrenOf(k.PID)
	return k
}

// readReady reads the fake's ready file: its pid, where its control
// listener is, and its daemon's pid (0: none).
func readReady(path string) (pid int, where string, daemon int, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, "", 0, false
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	pid, err = strconv.Atoi(lines[0])
	if len(lines) > 1 {
		where = lines[1]
	}
	if len(lines) > 2 {
		daemon, _ = strconv.Atoi(lines[2])
	}
	return pid, where, daemon, err == nil
}

// startInit starts a stand-in for a container's init process (a sleep in
// its own group) for a wrapper to watch; cleanup kills it.
func startInit(t testing.TB) int {
	t.Helper()
	c := exec.Command("sleep", "1000000")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatalf("start init stand-in: %v", err)
	}
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	t.Cleanup(func() {
		c.Process.Kill()
		<-done
	})
	return c.Process.Pid
}

// childrenOf lists the live direct children of pid.
func childrenOf(pid int) []fingerprint.Stat {
	ents, _ := os.ReadDir("/proc")
	var out []fingerprint.Stat
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, n)
		if err == nil && st.PPID == pid && !st.Zombie() {
			out = append(out, st)
		}
	}
	return out
}

func (k *KCServer) exitErr() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Exited is closed once the fake has exited (and been waited for).
func (k *KCServer) Exited() <-chan struct{} { return k.exited }

// Signal sends sig to the fake (by its PID, only while it has not been
// waited for, so the number cannot have been recycled).
func (k *KCServer) Signal(sig syscall.Signal) error {
	select {
	case <-k.exited:
		return os.ErrProcessDone
	default:
	}
	if k.PID == k.Cmd.Process.Pid {
		return k.Cmd.Process.Signal(sig)
	}
	// Under a wrapper the fake is not our child: signal it only while it
	// is still the process that got ready.
	p, err := fingerprint.Pin(fingerprint.DefaultRoot, k.self)
	if err != nil {
		return os.ErrProcessDone
	}
	defer p.Close()
	return p.Signal(sig)
}

// Kill SIGKILLs the fake and waits until it (or, under a wrapper, the
// wrapper, which then has nothing left to restart) has exited. Its sockets stay
// behind and its children live on, as with a real supervisor.
func (k *KCServer) Kill(t testing.TB) {
	t.Helper()
	k.Signal(syscall.SIGKILL)
	k.Wait(t)
}

// Wait waits (up to 15s) for the fake to exit (under a wrapper: for the
// wrapper to exit).
func (k *KCServer) Wait(t testing.TB) {
	t.Helper()
	select {
	case <-k.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("fake kcserver %d did not exit", k.PID)
	}
}

func (k *KCServer) cleanup() {
	k.Cmd.Process.Signal(syscall.SIGKILL)
	if k.self.PID != 0 {
		if p, err := fingerprint.Pin(fingerprint.DefaultRoot, k.self); err == nil {
			p.Signal(syscall.SIGKILL)
			p.Close()
		}
	}
	<-k.exited
	for _, c := range append(k.Children, k.Daemon) {
		if c.PID == 0 {
			continue
		}
		// Pinned: the daemon is not our child, its PID could be another's.
		if p, err := fingerprint.Pin(fingerprint.DefaultRoot, c); err == nil {
			p.Signal(syscall.SIGKILL)
			p.Close()
		}
	}
}
