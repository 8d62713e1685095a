package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// population is everything the harness starts, and the way it all goes
// away again. Every process is a direct child of the harness and is killed
// and reaped by PID: an unreaped child's PID cannot be recycled, so the
// kill can never reach another process. Children that lead a process group
// holding their own descendants (fake supervisors and their sleeps) get
// killpg(pid) first, while they are still unreaped, so the group ID is
// still theirs. Every child also has PR_SET_PDEATHSIG=SIGKILL, so a
// harness that dies without cleaning up takes them along; only the fake
// supervisors' own children (which the fake starts without it) can outlive
// a SIGKILLed harness.
type population struct {
	mu       sync.Mutex
	closed   bool
	fillers  []int
	children []*child
	groups   int
	next     int
	cleanups []func()
	once     sync.Once

	// hookBin runs trees' `kc-hook supervise` wrappers; they watch
	// initPID (a sleep the population owns) as their container's init.
	hookBin   string
	initPID   int
	initTicks uint64

	mode       string // "clone" or "exec"
	fillerBin  string
	groupSizes []int
	tmp        string
	devnull    *os.File
	spawn      chan func()
}

// child is an exec'd direct child of the harness.
type child struct {
	pid    int
	name   string
	leads  bool // leads a process group of its own descendants
	log    string
	reaped bool
	status syscall.WaitStatus
}

func newPopulation(tmp, mode, fillerBin string, sizes []int) (*population, error) {
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	p := &population{mode: mode, fillerBin: fillerBin, groupSizes: sizes, tmp: tmp, devnull: devnull, spawn: make(chan func())}
	// The spawner runs on one locked OS thread for the harness's whole
	// life: PR_SET_PDEATHSIG fires when the *thread* that created a child
	// exits, and a locked goroutine that never returns keeps its thread.
	go func() {
		runtime.LockOSThread()
		for f := range p.spawn {
			f()
		}
		select {} // never return while locked: that would end the thread
	}()
	return p, nil
}

// onSpawner runs f on the spawner's thread and waits for it.
func (p *population) onSpawner(f func()) {
	done := make(chan struct{})
	p.spawn <- func() { f(); close(done) }
	<-done
}

// atCleanup registers f to run (last registered first) at cleanup.
func (p *population) atCleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

// countProcesses counts the processes on the host (the numeric entries of
// /proc: thread-group leaders, kernel threads included).
func countProcesses() int {
	f, err := os.Open("/proc")
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	n := 0
	for _, name := range names {
		if name != "" && name[0] >= '0' && name[0] <= '9' {
			n++
		}
	}
	return n
}

// grow adds filler processes, in process groups, until the host has about
// target processes. It returns how many it added.
func (p *population) grow(target int) (int, error) {
	need := target - countProcesses()
	if need <= 0 {
		return 0, nil
	}
	var err error
	added := 0
	p.onSpawner(func() { added, err = p.addFillers(need) })
	return added, err
}

func (p *population) addFillers(n int) (int, error) {
	added := 0
	for added < n {
		size := p.groupSizes[p.next%len(p.groupSizes)]
		p.next++
		if size > n-added {
			size = n - added
		}
		leader := 0
		for i := 0; i < size; i++ {
			pid, err := p.spawnFiller(leader)
			if err != nil {
				return added, fmt.Errorf("starting filler %d of %d: %w", added+1, n, err)
			}
			if i == 0 {
				leader = pid
			}
			added++
		}
		p.mu.Lock()
		p.groups++
		p.mu.Unlock()
	}
	return added, nil
}

// spawnFiller starts one filler in process group pgid (0: a new group it
// leads) and records it.
func (p *population) spawnFiller(pgid int) (int, error) {
	var pid int
	var err error
	if p.mode == "clone" {
		pid, err = cloneFiller()
		if err == nil {
			// The child never execs, so the parent may move it.
			if e := syscall.Setpgid(pid, pgid); e != nil {
				err = fmt.Errorf("setpgid: %w", e)
			}
		}
	} else {
		pid, err = syscall.ForkExec(p.fillerBin, []string{"sleep", "3600"}, &syscall.ProcAttr{
			Files: []uintptr{p.devnull.Fd(), p.devnull.Fd(), p.devnull.Fd()},
			Sys:   &syscall.SysProcAttr{Setpgid: true, Pgid: pgid, Pdeathsig: syscall.SIGKILL},
		})
	}
	if pid > 0 {
		p.mu.Lock()
		p.fillers = append(p.fillers, pid)
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return pid, errors.New("harness is shutting down")
		}
	}
	return pid, err
}

// leading is where start puts a child: in a new process group it leads,
// or in a new session it leads (as kc-hook starts `kc-hook supervise`).
type leading int

const (
	newGroup leading = iota
	newSession
)

// start execs argv[0] as a direct child with stdout and stderr in a log
// file, leading a new process group or session (do not use newGroup for
// programs that call setsid themselves).
func (p *population) start(name string, argv []string, env []string, lead leading) (*child, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("harness is shutting down")
	}
	p.mu.Unlock()
	logPath := filepath.Join(p.tmp, "logs", fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if env == nil {
		env = os.Environ()
	}
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{p.devnull.Fd(), logf.Fd(), logf.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: lead == newGroup, Setsid: lead == newSession, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	c := &child{pid: pid, name: name, leads: true, log: logPath}
	p.mu.Lock()
	p.children = append(p.children, c)
	p.mu.Unlock()
	return c, nil
}

// exited reports (without blocking) whether c has exited. An exited c is
// then reaped, after its group is killed (see reap).
func (p *population) exited(c *child) bool {
	p.mu.Lock()
	if c.reaped {
		p.mu.Unlock()
		return true
	}
	var info unix.Siginfo
	// WNOWAIT: look, but leave it unreaped, so its PID (and group ID)
	// stays ours until reap has killed the group.
	err := unix.Waitid(unix.P_PID, c.pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	p.mu.Unlock()
	if err != nil && !errors.Is(err, unix.ECHILD) {
		return false
	}
	if err == nil && info.Signo == 0 {
		return false // no state change: still running (waitid leaves a zeroed siginfo)
	}
	p.reap(c)
	return true
}

// reapOnExit reaps c as soon as it exits, as the parent of a real
// supervisor (Positron Server, kc-hook supervise) does. Until then c's PID,
// and the group ID of the group it leads, stay ours; once reaped, c is
// never signalled again (reap checks c.reaped first).
func (p *population) reapOnExit(c *child) {
	go func() {
		var info unix.Siginfo
		// WNOWAIT: learn of the exit without reaping, so that reap,
		// under the lock, stays the only place that does.
		for unix.Waitid(unix.P_PID, c.pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !c.reaped {
			syscall.Wait4(c.pid, &c.status, 0, nil)
			c.reaped = true
		}
	}()
}

// reapOnExitPID is reapOnExit for the child with that PID, if any.
func (p *population) reapOnExitPID(pid int) {
	p.mu.Lock()
	var c *child
	for _, ch := range p.children {
		if ch.pid == pid {
			c = ch
		}
	}
	p.mu.Unlock()
	if c != nil {
		p.reapOnExit(c)
	}
}

// reap kills c's group (while c is unreaped, the group is c's), then c,
// and waits for it.
func (p *population) reap(c *child) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.reaped {
		return
	}
	if c.leads {
		syscall.Kill(-c.pid, syscall.SIGKILL)
	}
	syscall.Kill(c.pid, syscall.SIGKILL)
	syscall.Wait4(c.pid, &c.status, 0, nil)
	c.reaped = true
}

// logTail returns the end of c's log, for error messages.
func (c *child) logTail() string {
	data, _ := os.ReadFile(c.log)
	s := strings.TrimSpace(string(data))
	if len(s) > 400 {
		s = "…" + s[len(s)-400:]
	}
	return s
}

// startKCServer starts the fake supervisor (socket transport, the fake's
// KCFAKE_* knobs, more kcserver flags in args) in a new process group and
// waits until it listens; it returns the group's leader and the fake's
// pid. kcserver has no container-ID flag: with cid, the fake runs as the
// command of a `kc-hook supervise <cid> …` wrapper, which carries the ID
// and leads the group, as kc-hook starts supervisors.
func (p *population) startKCServer(bin, name, cid string, knobs []string, args ...string) (*child, int, error) {
	ready := filepath.Join(p.tmp, "ready", fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
	if err := os.MkdirAll(filepath.Dir(ready), 0o755); err != nil {
		return nil, 0, err
	}
	argv := append([]string{bin, "--transport=socket"}, args...)
	if cid != "" {
		init, ticks, err := p.initStandIn()
		if err != nil {
			return nil, 0, err
		}
		argv = append([]string{p.hookBin, "supervise", "--state-dir=", "--max-restarts=0",
			cid, strconv.Itoa(init), strconv.FormatUint(ticks, 10), "--"}, argv...)
		// The wrapper contains the fake in kc-watchman/<cid>; killed at
		// the end, it never removes it.
		p.atCleanup(func() { removeCgroups(cid) })
	}
	env := append(append(os.Environ(), "KCFAKE_READY_FILE="+ready), knobs...)
	lead := newGroup
	if cid != "" {
		lead = newSession
	}
	c, err := p.start(name, argv, env, lead)
	if err != nil {
		return nil, 0, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if data, err := os.ReadFile(ready); err == nil {
			first, _, _ := strings.Cut(string(data), "\n")
			if pid, err := strconv.Atoi(first); err == nil && (cid != "" || pid == c.pid) {
				os.Remove(ready)
				return c, pid, nil
			}
		}
		if p.exited(c) {
			return nil, 0, fmt.Errorf("%s exited before it was ready: %s", name, c.logTail())
		}
		if time.Now().After(deadline) {
			p.reap(c)
			return nil, 0, fmt.Errorf("%s not ready after 30s: %s", name, c.logTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// initStandIn starts (once) the process trees' wrappers watch as their
// container's init.
func (p *population) initStandIn() (int, uint64, error) {
	p.mu.Lock()
	pid, ticks := p.initPID, p.initTicks
	p.mu.Unlock()
	if pid != 0 {
		return pid, ticks, nil
	}
	if p.hookBin == "" {
		return 0, 0, errors.New("no kc-hook to run supervisor trees with")
	}
	c, err := p.start("init-stand-in", []string{"/bin/sleep", "1000000"}, nil, newGroup)
	if err != nil {
		return 0, 0, err
	}
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, c.pid)
	if err != nil {
		return 0, 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.initPID == 0 {
		p.initPID, p.initTicks = c.pid, st.StartTicks
	}
	return p.initPID, p.initTicks, nil
}

// cleanup kills and reaps everything, then runs the registered cleanups.
// It is safe to call more than once and from a signal handler goroutine.
func (p *population) cleanup() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		children := append([]*child(nil), p.children...)
		fillers := append([]int(nil), p.fillers...)
		cleanups := append([]func(){}, p.cleanups...)
		p.mu.Unlock()
		for _, c := range children {
			p.reap(c)
		}
		for _, pid := range fillers {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, pid := range fillers {
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
		}
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	})
}

// fillerCount returns the number of fillers and groups started.
func (p *population) fillerCount() (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.fillers), p.groups
}

// removeCgroups kills what is left in the kc-watchman/<cid> cgroups the
// trees' wrappers made and removes them, and kc-watchman/ once empty.
func removeCgroups(cid string) {
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"} {
		dir := filepath.Join(m, "kc-watchman", cid)
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) //nolint:errcheck // v1 has none; the fake's group was killed already
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err := syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) || time.Now().After(deadline) {
				break
			}
		}
		syscall.Rmdir(filepath.Dir(dir)) //nolint:errcheck // in use by another container's, or not empty
	}
}
