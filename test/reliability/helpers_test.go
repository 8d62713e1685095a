//go:build reliability

package reliability

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const procRoot = "/proc"

// ---------------------------------------------------------------------------
// Binaries: kc-hook and kc-janitor built as the Makefile builds them, and
// "supervisors" — copies of sleep(1) named after a private comm.

const binEnv = "KC_REL_BIN" // set for helper processes: the binaries' dir

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	ownBinDir bool

	supMu   sync.Mutex
	supBins = map[string]string{}
)

// binaries builds bin/kc-hook and bin/kc-janitor once (tags of the
// Makefile, CGO_ENABLED=0) and returns their directory, which is 0755 so
// that other users can run what is in it.
func binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if d := os.Getenv(binEnv); d != "" {
			binDir = d
			return
		}
		binDir, buildErr = os.MkdirTemp("", "kc-rel-bin-")
		if buildErr != nil {
			return
		}
		ownBinDir = true
		if buildErr = os.Chmod(binDir, 0o755); buildErr != nil {
			return
		}
		for name, pkg := range map[string]string{"kc-hook": testutil.KCHookPackage, "kc-janitor": testutil.KCJanitorPackage} {
			if buildErr = testutil.GoBuild(pkg, filepath.Join(binDir, name)); buildErr != nil {
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func hookBin(t testing.TB) string    { return filepath.Join(binaries(t), "kc-hook") }
func janitorBin(t testing.TB) string { return filepath.Join(binaries(t), "kc-janitor") }

func cleanupBinaries() {
	if ownBinDir && binDir != "" {
		os.RemoveAll(binDir)
	}
}

// supervisorBin returns a copy of sleep(1) whose file name is comm, so the
// processes it runs have that comm: a supervisor name no other package's
// janitor run will ever match.
func supervisorBin(t testing.TB, comm string) string {
	t.Helper()
	if len(comm) > 15 {
		t.Fatalf("comm %q is longer than 15 bytes", comm)
	}
	supMu.Lock()
	defer supMu.Unlock()
	if p, ok := supBins[comm]; ok {
		return p
	}
	dir := filepath.Join(binaries(t), "sup")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, comm)
	if err := testutil.CopyFile(sleep, p, 0o755); err != nil {
		t.Fatal(err)
	}
	supBins[comm] = p
	return p
}

// ---------------------------------------------------------------------------
// Processes.

// child is a process this test started and alone reaps, so signalling it
// by PID is safe until done is closed.
type child struct {
	Cmd  *exec.Cmd
	PID  int
	Stat fingerprint.Stat // identity right after start
	done <-chan struct{}
}

// startChild starts path with argv (argv[0] included) and attr, reaps it
// in the background, and reads its identity.
func startChild(path string, argv []string, attr *syscall.SysProcAttr) (*child, error) {
	cmd := &exec.Cmd{Path: path, Args: argv, SysProcAttr: attr}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	c := &child{Cmd: cmd, PID: cmd.Process.Pid, done: done}
	go func() { cmd.Wait(); close(done) }()
	st, err := fingerprint.ReadStat(procRoot, c.PID)
	if err != nil {
		c.Kill()
		return nil, err
	}
	c.Stat = st
	return c, nil
}

// Kill SIGKILLs the child (os.Process signals through a pidfd) and waits
// until it is reaped.
func (c *child) Kill() {
	if c == nil {
		return
	}
	_ = c.Cmd.Process.Kill()
	<-c.done
}

// Dead reports whether the child has exited and been reaped.
func (c *child) Dead() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WaitDead waits until the child has been reaped.
func (c *child) WaitDead(timeout time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// startSupervisor starts a fake supervisor: a copy of sleep named comm
// whose argv[0] carries the container ID, making it an anchor.
func startSupervisor(t testing.TB, comm, cid string, attr *syscall.SysProcAttr) *child {
	t.Helper()
	c, err := startChild(supervisorBin(t, comm), []string{"--container-id=" + cid, "1000000"}, attr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	return c
}

// startKernel starts a plain sleep ("a kernel": no container ID, no
// supervisor comm).
func startKernel(t testing.TB, attr *syscall.SysProcAttr) *child {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	c, err := startChild(sleep, []string{"sleep", "1000000"}, attr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	return c
}

// groupMembers lists the live members of process group pgid.
func groupMembers(pgid int) []fingerprint.Stat {
	ents, _ := os.ReadDir(procRoot)
	var out []fingerprint.Stat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat(procRoot, pid)
		if err != nil || st.PGID != pgid || st.Zombie() {
			continue
		}
		out = append(out, st)
	}
	return out
}

// aliveOf returns the members of ms still alive as the same processes.
func aliveOf(ms []fingerprint.Stat) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range ms {
		if fingerprint.Alive(procRoot, m) {
			out = append(out, m)
		}
	}
	return out
}

// killByIdentity SIGKILLs whichever of ms are still the recorded
// processes, through a pidfd pinned after checking the start time.
func killByIdentity(ms []fingerprint.Stat) {
	for _, m := range ms {
		if p, err := fingerprint.Pin(procRoot, m); err == nil {
			p.Signal(syscall.SIGKILL)
			p.Close()
		}
	}
}

// stoppedOf returns the members of ms that are stopped (state T or t).
func stoppedOf(ms []fingerprint.Stat) []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range ms {
		st, err := fingerprint.Revalidate(procRoot, m)
		if err == nil && (st.State == 'T' || st.State == 't') {
			out = append(out, st)
		}
	}
	return out
}

// waitAllDead polls until none of ms is alive.
func waitAllDead(ms []fingerprint.Stat, within time.Duration) bool {
	return proc.Poll(within, func() bool { return len(aliveOf(ms)) == 0 })
}

// ---------------------------------------------------------------------------
// Running kc-hook and kc-janitor.

type toolRun struct {
	Stdout, Stderr string
	Code           int
	Took           time.Duration
}

// runTool runs bin with args, env and stdin, bounded by 2 minutes.
func runTool(t testing.TB, bin string, env []string, stdin string, args ...string) toolRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := toolRun{Stdout: out.String(), Stderr: errb.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ctx.Err() != nil {
			t.Fatalf("%s %s: %v (stderr %s)", filepath.Base(bin), strings.Join(args, " "), err, r.Stderr)
		}
		r.Code = ee.ExitCode()
	}
	return r
}

// hookState is the runtime-spec State a runtime gives kc-hook at poststop.
func hookState(cid string) string {
	return `{"ociVersion":"1.0.2","id":"` + cid + `","status":"stopped","bundle":"/nonexistent"}`
}

// fakePodman writes an executable "podman" with the given shell body into
// a new directory and returns the directory (for PATH).
func fakePodman(t testing.TB, body string) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(dir, "podman"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// noContainersPodman is a podman CLI that knows no containers at all:
// every container ID asked about is gone.
func noContainersPodman(t testing.TB) string { return fakePodman(t, `echo '[]'`) }

// baseEnv is a minimal environment with PATH set to path.
func baseEnv(path string, extra ...string) []string {
	env := []string{"PATH=" + path, "HOME=/root", "LANG=C"}
	return append(env, extra...)
}

// janitorGround are the reconcile flags that make a fake podman CLI on
// PATH the ground truth: an API URL that does not exist and an explicit
// (harmless) CLI argument, so the CLI's answer is ground truth for this
// process's UID.
func janitorGround() []string {
	return []string{"--podman-url", "unix:///nonexistent/kc-rel/podman.sock", "--podman-arg=--log-level=error", "--podman-timeout", "5s"}
}

// newCID returns a random container ID.
func newCID(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// shortDir makes a short directory (Unix socket paths must stay under 108
// bytes) removed when t ends.
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// ---------------------------------------------------------------------------
// Bystanders: innocent processes that count every signal they receive —
// proc.Innocent (this test binary in a helper mode; TestMain calls
// proc.Main), reaped the moment it exits so that Dead and Harm tell
// whether something killed it.

// bystander is a running innocent process.
type bystander = proc.Innocent

// startBystander starts a bystander with attr, optionally named comm.
func startBystander(attr *syscall.SysProcAttr, comm string) (*bystander, error) {
	return proc.StartInnocentWith(attr, proc.InnocentOptions{Comm: comm, Reap: true})
}

// asChild is b as a child this test reaps, for what kills children.
func asChild(b *bystander) *child {
	return &child{Cmd: b.Cmd, PID: b.PID, Stat: b.Stat, done: b.Done()}
}

// stopping reports whether pid is stopped or has a SIGSTOP on its way.
func stopping(pid int) bool {
	st, err := fingerprint.ReadStat(procRoot, pid)
	if err != nil {
		return false
	}
	if st.State == 'T' || st.State == 't' {
		return true
	}
	return pending(pid, syscall.SIGSTOP)
}

// pending reports whether sig is pending for pid (or its thread group).
func pending(pid int, sig syscall.Signal) bool {
	for _, key := range []string{"ShdPnd", "SigPnd"} {
		if m, err := proc.SignalMask(procRoot, pid, key); err == nil && proc.HasSignal(m, sig) {
			return true
		}
	}
	return false
}

// mustBystander starts a bystander or fails t; it is killed when t ends.
func mustBystander(t testing.TB, attr *syscall.SysProcAttr, comm string) *bystander {
	t.Helper()
	b, err := startBystander(attr, comm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// inGroup is the SysProcAttr that puts a new process into group pgid.
func inGroup(pgid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
}

// listingPodman is a podman CLI whose `ps` lists what the test last set
// with the returned function (container ID -> raw podman state).
func listingPodman(t testing.TB) (dir string, set func(states map[string]string)) {
	t.Helper()
	list := filepath.Join(t.TempDir(), "ps.json")
	set = func(states map[string]string) {
		type entry struct {
			ID    string `json:"Id"`
			State string `json:"State"`
		}
		es := []entry{}
		for id, st := range states {
			es = append(es, entry{id, st})
		}
		data, err := json.Marshal(es)
		if err != nil {
			t.Fatal(err)
		}
		tmp := list + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, list); err != nil {
			t.Fatal(err)
		}
	}
	set(nil)
	return fakePodman(t, "cat '"+list+"'"), set
}

// orphanSocket leaves a socket file at dir/name with nothing listening:
// what a SIGKILLed supervisor leaves behind.
func orphanSocket(t testing.TB, dir, name string) string { return testutil.OrphanSocket(t, dir, name) }

// reconcileJSON is the part of `kc-janitor reconcile --format json` the
// suite reads.
type reconcileJSON struct {
	LivenessKnown bool   `json:"liveness_known"`
	Source        string `json:"source"`
	DryRun        bool   `json:"dry_run"`
	Trees         []struct {
		ContainerID string `json:"container_id"`
		PGID        int    `json:"pgid"`
		UID         int    `json:"uid"`
		Action      string `json:"action"`
		Error       *string
		Members     []struct {
			PID        int    `json:"pid"`
			StartTicks uint64 `json:"start_ticks"`
			Comm       string `json:"comm"`
		} `json:"members"`
	} `json:"trees"`
	LedgerCollected int `json:"ledger_collected"`
}

func (r reconcileJSON) action(pgid int) string {
	for _, t := range r.Trees {
		if t.PGID == pgid {
			return t.Action
		}
	}
	return ""
}

// sweepJSON is `kc-janitor sweep --format json`.
type sweepJSON struct {
	DryRun  bool `json:"dry_run"`
	Sockets []struct {
		Path    string  `json:"path"`
		PID     int     `json:"pid"`
		Kind    string  `json:"kind"`
		Verdict string  `json:"verdict"`
		Reason  string  `json:"reason"`
		Action  string  `json:"action"`
		Error   *string `json:"error"`
	} `json:"sockets"`
}

func decodeJSON(t testing.TB, r toolRun, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.Stdout), v); err != nil {
		t.Fatalf("no JSON (exit %d): %v\nstdout: %s\nstderr: %s", r.Code, err, r.Stdout, r.Stderr)
	}
}

// stopContainer stops a real container and waits until nothing local
// says it still runs (DESIGN "Ground truth must be corroborated"): no process of it left in its cgroup
// under its conmon, no recorded init alive.
func stopContainer(t testing.TB, e *podmantest.Env, id string) {
	t.Helper()
	e.Stop(t, id)
	for deadline := time.Now().Add(30 * time.Second); ; {
		ev, running, err := corroborate.New(procRoot, nil, nil, "").Running(id, 0)
		if err == nil && !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s stopped but still looks alive after 30s: %v %v", id, ev, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
