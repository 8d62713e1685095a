// Package podmantest gives end-to-end tests a private, throw-away podman:
// its own containers.conf, storage.conf, storage, tmp dir, locks, hooks
// dir, busybox rootfs and (on demand) API service, all under one temp dir.
// The host's own podman — /var/lib/containers, /run/libpod, the
// /dev/shm/libpod_lock segment, /etc/containers — is never written.
//
// Import it from _test.go files only.
//
// What podman 4.3.1 (Debian 12) + runc needs on these machines, found by
// experiment (root, 2 cores, cgroups v1 hybrid, PID 1 is not systemd):
//
//   - runtime "runc": crun fails here ("cgroups in hybrid mode not
//     supported").
//   - default_ulimits nofile/nproc 1024: the default rlimits fail.
//   - cgroup_manager "cgroupfs": there is no systemd to talk to.
//   - netns "none" (and --network none on run): no network is needed, and
//     it keeps netavark, iptables and /etc/containers/networks out of it.
//     network_config_dir is private anyway.
//   - events_logger "file": no journald; the log lands in the private tmp
//     dir.
//   - lock_type "file": the default shm locks live in the host-wide
//     /dev/shm/libpod_lock segment, and a fresh tmp dir makes podman
//     "refresh", which frees every lock in that segment — including the
//     host podman's. File locks live in <tmp_dir>/locks.
//   - storage driver "vfs": containers run from --rootfs, so there are no
//     image layers to copy and vfs costs nothing; unlike overlay it leaves
//     no mounts behind (only the per-container shm tmpfs, gone after rm).
//     Measured on an idle machine, 5 runs each: run -d 0.39s vfs vs 0.41s
//     overlay, stop -t 0 0.31s vs 0.42s, rm 0.05s each. In the smoke test,
//     with other test binaries loading the 2 cores: run -d 0.4-0.9s,
//     stop -t 0 0.3-0.5s, rm 0.2s, StartAPI (until /_ping answers)
//     0.15-0.3s. A whole New+Run+Stop+cleanup cycle is 1.5-2s.
//   - The API socket path must stay under 108 bytes, so the base dir is a
//     short os.MkdirTemp name, not t.TempDir().
//   - CONTAINERS_CONF alone replaces every other containers.conf (podman
//     reads no /etc or /usr/share one then); CONTAINERS_STORAGE_CONF does
//     the same for storage.conf. Env passes both and the equivalent global
//     flags, so either reaches the private setup.
//
// Poststop hooks are resolved when the container is created and kept in
// podman's state, so they fire from "podman stop", "podman rm -f" and
// conmon's asynchronous "podman container cleanup" alike. Hooks run with an
// empty environment (no PATH unless the descriptor sets env) and podman's
// cwd.
package podmantest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// cmdTimeout bounds every podman CLI call, so a wedged podman fails the
// test instead of hanging it until go test's global timeout.
const cmdTimeout = 2 * time.Minute

// Env is one private podman setup. Methods are safe for concurrent use.
type Env struct {
	podman string // absolute path of the podman binary

	dir         string // base dir; everything below is removed on cleanup
	rootfs      string
	hooksDir    string
	graphRoot   string
	runRoot     string
	tmpDir      string
	conf        string // containers.conf
	storageConf string // storage.conf
	sock        string // API socket path

	owner *os.File // holds the flock that marks the dir as in use

	mu  sync.Mutex
	api *apiProc
}

// dirPrefix names Env dirs in os.TempDir(); short, for the socket path.
const dirPrefix = "kcpm-"

// ownerFile, in an Env's dir, is flock(LOCK_SH)-ed by the test process for
// the Env's lifetime. Locks die with their process, so a dir whose owner
// lock can be taken exclusively belongs to a test binary that died without
// cleaning up (go test's timeout panics skip t.Cleanup); the next New reaps
// it.
const ownerFile = ".owner"

func envAt(podman, dir string) *Env {
	return &Env{
		podman:      podman,
		dir:         dir,
		rootfs:      filepath.Join(dir, "rootfs"),
		hooksDir:    filepath.Join(dir, "hooks"),
		graphRoot:   filepath.Join(dir, "root"),
		runRoot:     filepath.Join(dir, "run"),
		tmpDir:      filepath.Join(dir, "tmp"),
		conf:        filepath.Join(dir, "containers.conf"),
		storageConf: filepath.Join(dir, "storage.conf"),
		sock:        filepath.Join(dir, "podman.sock"),
	}
}

// lockOwner takes the shared owner lock of dir. The lock file is locked
// under a temporary name and then renamed, so a reaper never sees an
// unlocked owner file of a live Env.
func lockOwner(dir string) (*os.File, error) {
	tmp := filepath.Join(dir, ownerFile+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", tmp, err)
	}
	fmt.Fprintf(f, "%d\n", os.Getpid())
	if err := os.Rename(tmp, filepath.Join(dir, ownerFile)); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

var reapStale sync.Once

// reapStaleEnvs tears down the Envs of dead test binaries: dirs named
// dirPrefix* in os.TempDir() holding an owner file nobody has locked.
// Dirs without an owner file (being created, or not ours) are left alone.
func reapStaleEnvs(podman string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		f, err := os.Open(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close() // owner alive, or another reaper at work
			continue
		}
		logf("podmantest: reaping %s, left behind by a dead test binary", dir)
		if err := envAt(podman, dir).teardown(logf); err != nil {
			logf("podmantest: reaping %s: %v", dir, err)
		}
		f.Close()
	}
}

type apiProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
	log  string
}

// Requirements reports why real podman end-to-end tests cannot run here,
// or nil when they can.
func Requirements() error {
	if os.Geteuid() != 0 {
		return errors.New("podmantest needs root (rootful podman)")
	}
	for _, b := range []string{"podman", "runc", "conmon"} {
		if _, err := lookTool(b); err != nil {
			return fmt.Errorf("%s not installed", b)
		}
	}
	if _, err := staticBusybox(); err != nil {
		return err
	}
	return nil
}

// lookTool finds a binary in PATH or the usual sbin/libexec places (go test
// may run with a trimmed PATH).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/libexec/podman", "/usr/local/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", name)
}

// staticBusybox returns the path of a statically linked busybox (Debian's
// busybox-static installs /bin/busybox). A dynamic one would not run in a
// rootfs without libc.
func staticBusybox() (string, error) {
	var cands []string
	if p, err := exec.LookPath("busybox"); err == nil {
		cands = append(cands, p)
	}
	cands = append(cands, "/bin/busybox", "/usr/bin/busybox")
	for _, p := range cands {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p, nil
		}
	}
	return "", errors.New("no statically linked busybox (apt-get install busybox-static)")
}

var applets struct {
	once sync.Once
	list []string
	err  error
}

// busyboxApplets lists the applets of bb, once per test binary.
func busyboxApplets(bb string) ([]string, error) {
	applets.once.Do(func() {
		out, err := exec.Command(bb, "--list").Output()
		if err != nil {
			applets.err = fmt.Errorf("%s --list: %w", bb, err)
			return
		}
		for _, a := range strings.Fields(string(out)) {
			if a != "busybox" && !strings.Contains(a, "/") {
				applets.list = append(applets.list, a)
			}
		}
		if len(applets.list) == 0 {
			applets.err = fmt.Errorf("%s --list: no applets", bb)
		}
	})
	return applets.list, applets.err
}

// New builds a private podman setup and registers its cleanup with t. It
// skips the test when podman, runc, conmon or a static busybox is missing,
// or when not root — unless KC_E2E=1, which turns that into a failure.
func New(t testing.TB) *Env {
	t.Helper()
	if err := Requirements(); err != nil {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatalf("KC_E2E=1 but %v", err)
		}
		t.Skip(err)
	}
	podman, _ := lookTool("podman")
	bb, _ := staticBusybox()
	// Cleanups run last-registered first. The test's t.TempDir dirs (a
	// hook's state dir, a supervisor's socket dir) must be removed after
	// the teardown below, whose podman rm fires the poststop hooks that
	// write there: removed before, they were made again and left in /tmp.
	// Asking for one here registers their removal before the teardown.
	_ = t.TempDir()

	reapStale.Do(func() { reapStaleEnvs(podman, t.Logf) })

	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	e := envAt(podman, dir)
	if e.owner, err = lockOwner(dir); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("podmantest: %v", err)
	}
	t.Cleanup(func() { e.cleanup(t) })
	if err := e.layout(bb); err != nil {
		t.Fatalf("podmantest: %v", err)
	}
	return e
}

// layout writes the config files, directories and rootfs.
func (e *Env) layout(bb string) error {
	for _, d := range []string{e.hooksDir, e.graphRoot, e.runRoot, e.tmpDir,
		e.path("networks"), e.path("xdg/config"), e.path("xdg/data"), e.path("xdg/run")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`# podmantest: private podman setup, see package doc.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"
log_driver = "k8s-file"

[network]
network_config_dir = %q

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
tmp_dir = %q
volume_path = %q
hooks_dir = [%q]
`, e.path("networks"), e.tmpDir, filepath.Join(e.graphRoot, "volumes"), e.hooksDir)
	storage := fmt.Sprintf(`[storage]
driver = "vfs"
graphroot = %q
runroot = %q
`, e.graphRoot, e.runRoot)
	files := map[string]string{
		e.conf:                      conf,
		e.storageConf:               storage,
		e.path("registries.conf"):   "unqualified-search-registries = []\n",
		e.path("rootfs/etc/passwd"): "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		e.path("rootfs/etc/group"):  "root:x:0:\nnogroup:x:65534:\n",
	}
	for _, d := range []string{"bin", "etc", "dev", "proc", "sys", "run", "root", "var"} {
		if err := os.MkdirAll(filepath.Join(e.rootfs, d), 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		p := filepath.Join(e.rootfs, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o1777); err != nil {
			return err
		}
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return err
		}
	}
	if err := testutil.CopyFile(bb, filepath.Join(e.rootfs, "bin/busybox"), 0o755); err != nil {
		return err
	}
	list, err := busyboxApplets(bb)
	if err != nil {
		return err
	}
	for _, a := range list {
		if err := os.Symlink("busybox", filepath.Join(e.rootfs, "bin", a)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}

func (e *Env) path(rel string) string { return filepath.Join(e.dir, rel) }

// Dir is the Env's base directory (removed on cleanup). Tests may put
// their own files there, e.g. hook scripts and markers.
func (e *Env) Dir() string { return e.dir }

// HooksDir is the oci-hooks(5) descriptor directory podman is started with
// (--hooks-dir). Descriptors must be in place before the container is
// created: podman reads them at create time.
func (e *Env) HooksDir() string { return e.hooksDir }

// Rootfs is the busybox root file system containers run from: /bin/busybox
// with every applet symlinked in /bin, /etc/passwd, /tmp.
func (e *Env) Rootfs() string { return e.rootfs }

// ConfPath is the private containers.conf (CONTAINERS_CONF).
func (e *Env) ConfPath() string { return e.conf }

// PodmanPath is the podman binary the Env runs.
func (e *Env) PodmanPath() string { return e.podman }

// GlobalArgs are the podman global flags that select this Env. Together
// with Environ they are redundant on purpose: either alone reaches the
// private setup (code under test that execs plain "podman" only needs
// Environ).
func (e *Env) GlobalArgs() []string {
	return []string{
		"--root", e.graphRoot,
		"--runroot", e.runRoot,
		"--storage-driver", "vfs",
		"--tmpdir", e.tmpDir,
		"--hooks-dir", e.hooksDir,
		"--runtime", "runc",
		"--cgroup-manager", "cgroupfs",
		"--events-backend", "file",
		"--network-config-dir", e.path("networks"),
	}
}

// EnvVars are the variables that point podman at this Env's configuration
// and keep it off the host's and the user's config files.
func (e *Env) EnvVars() []string {
	return []string{
		"CONTAINERS_CONF=" + e.conf,
		"CONTAINERS_STORAGE_CONF=" + e.storageConf,
		"CONTAINERS_REGISTRIES_CONF=" + e.path("registries.conf"),
		"XDG_CONFIG_HOME=" + e.path("xdg/config"),
		"XDG_DATA_HOME=" + e.path("xdg/data"),
		"XDG_RUNTIME_DIR=" + e.path("xdg/run"),
	}
}

// Environ is os.Environ() minus anything that would redirect podman
// (CONTAINER_HOST, CONTAINERS_*, XDG_*) plus EnvVars.
func (e *Env) Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "CONTAINERS_"), strings.HasPrefix(k, "CONTAINER_"),
			strings.HasPrefix(k, "XDG_"), k == "DOCKER_HOST":
			continue
		}
		env = append(env, kv)
	}
	return append(env, e.EnvVars()...)
}

// Podman runs podman with the Env's global flags and environment and
// returns its stdout with surrounding white space trimmed. A failure's
// error carries podman's stderr.
func (e *Env) Podman(args ...string) (stdout string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return e.podmanCtx(ctx, args...)
}

func (e *Env) podmanCtx(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.podman, append(e.GlobalArgs(), args...)...)
	cmd.Env = e.Environ()
	cmd.Dir = e.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		return strings.TrimSpace(out.String()), fmt.Errorf("podman %s: %w: %s",
			strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// DefaultCommand is what Run starts when no command is given. sleep as
// PID 1 ignores SIGTERM, which is why Stop uses a zero timeout.
var DefaultCommand = []string{"/bin/sleep", "100000"}

// Run starts a detached container from the Env's rootfs and returns its
// full 64-hex ID. args are extra "podman run" flags (--name, --annotation
// k=v, --label, ...); a "--" among them ends the flags and what follows is
// the command, which defaults to DefaultCommand:
//
//	id := e.Run(t, "--name", "web", "--annotation", "a=b")
//	id := e.Run(t, "--", "/bin/sh", "-c", "trap 'exit 0' TERM; sleep 1000 & wait")
func (e *Env) Run(t testing.TB, args ...string) (id string) {
	t.Helper()
	flags, command := args, DefaultCommand
	for i, a := range args {
		if a == "--" {
			flags, command = args[:i], args[i+1:]
			break
		}
	}
	if len(command) == 0 {
		t.Fatal("podmantest.Run: empty command after --")
	}
	full := []string{"run", "-d", "--network", "none"}
	full = append(full, flags...)
	full = append(full, "--rootfs", e.rootfs)
	full = append(full, command...)
	out, err := e.Podman(full...)
	if err != nil {
		t.Fatal(err)
	}
	// The ID is the last line; warnings may precede it.
	lines := strings.Split(out, "\n")
	id = strings.TrimSpace(lines[len(lines)-1])
	if !isFullID(id) {
		t.Fatalf("podman run printed %q, want a 64-hex container ID", out)
	}
	return id
}

func isFullID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Inspect returns "podman inspect --format <format> <id>".
func (e *Env) Inspect(t testing.TB, id, format string) string {
	t.Helper()
	out, err := e.Podman("inspect", "--type", "container", "--format", format, id)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// InitPID is the host PID of the container's init process (State.Pid); 0
// when the container is not running.
func (e *Env) InitPID(t testing.TB, id string) int {
	t.Helper()
	s := e.Inspect(t, id, "{{.State.Pid}}")
	pid, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("podman inspect %s: State.Pid %q: %v", id, s, err)
	}
	return pid
}

// State is the container's State.Status ("running", "exited", ...).
func (e *Env) State(t testing.TB, id string) string {
	t.Helper()
	return e.Inspect(t, id, "{{.State.Status}}")
}

// Stop runs "podman stop -t 0": SIGKILL right away (DefaultCommand ignores
// SIGTERM anyway). Poststop hooks have run when it returns. For a graceful
// stop use e.Podman("stop", "-t", "5", id).
func (e *Env) Stop(t testing.TB, id string) {
	t.Helper()
	if _, err := e.Podman("stop", "-t", "0", id); err != nil {
		t.Fatal(err)
	}
}

// Remove runs "podman rm -f -t 0": stops the container if needed and
// deletes it.
func (e *Env) Remove(t testing.TB, id string) {
	t.Helper()
	if _, err := e.Podman("rm", "-f", "-t", "0", id); err != nil {
		t.Fatal(err)
	}
}

// WriteHook writes an oci-hooks(5) 1.0.0 descriptor <name>.json into
// HooksDir that runs path with args (args[0] is argv[0]) and env at the
// given stages for every container, and returns the descriptor's path.
func (e *Env) WriteHook(t testing.TB, name, path string, args, env []string, stages ...string) string {
	t.Helper()
	type hook struct {
		Path string   `json:"path"`
		Args []string `json:"args,omitempty"`
		Env  []string `json:"env,omitempty"`
	}
	desc := struct {
		Version string          `json:"version"`
		Hook    hook            `json:"hook"`
		When    map[string]bool `json:"when"`
		Stages  []string        `json:"stages"`
	}{"1.0.0", hook{path, args, env}, map[string]bool{"always": true}, stages}
	b, err := json.MarshalIndent(desc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.hooksDir, name+".json")
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// APIURL is the URL StartAPI serves on ("unix:///…/podman.sock"), whether
// or not the service is running.
func (e *Env) APIURL() string { return "unix://" + e.sock }

// StartAPI starts "podman system service --time=0" on a Unix socket in the
// Env's dir, with the Env's flags and environment, waits until it answers
// GET /_ping and returns its URL (APIURL). Calling it while the service
// runs returns the URL again; after StopAPI it starts a new service on the
// same URL. The service is stopped on cleanup.
func (e *Env) StartAPI(t testing.TB) (url string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.api != nil {
		select {
		case <-e.api.done:
			e.api = nil // died on its own; start a new one
		default:
			return e.APIURL()
		}
	}
	_ = os.Remove(e.sock)
	logPath := e.path(fmt.Sprintf("api-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append(e.GlobalArgs(), "system", "service", "--time=0", e.APIURL())
	cmd := exec.Command(e.podman, args...)
	cmd.Env = e.Environ()
	cmd.Dir = e.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a ^C to go test doesn't reach it first, and
	// kill-by-PID below is the only way it is stopped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start podman system service: %v", err)
	}
	logf.Close()
	p := &apiProc{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.done) }()
	e.api = p

	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := ping(e.sock); err == nil {
			return e.APIURL()
		}
		select {
		case <-p.done:
			e.api = nil
			t.Fatalf("podman system service exited early (%v): %s", cmd.ProcessState, readLog(logPath))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.stopAPILocked()
			t.Fatalf("podman system service did not answer /_ping within 30s: %s", readLog(logPath))
		}
	}
}

func readLog(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// ping does GET /_ping on the Unix socket sock.
func ping(sock string) error {
	c := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := c.Get("http://d/_ping")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("_ping: %s %q", resp.Status, body)
	}
	return nil
}

// StopAPI stops the service StartAPI started (SIGTERM to its PID, SIGKILL
// after 10s) and waits for it to exit; its socket file is removed, so
// clients see the API as down. A no-op when it is not running.
func (e *Env) StopAPI(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.stopAPILocked(); err != nil {
		t.Error(err)
	}
}

func (e *Env) stopAPILocked() error {
	p := e.api
	if p == nil {
		return nil
	}
	e.api = nil
	defer os.Remove(e.sock)
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("podman system service pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// cleanup removes everything the Env made: the API service, all its
// containers, their conmon/cleanup processes, leftover mounts and the dir.
func (e *Env) cleanup(t testing.TB) {
	e.mu.Lock()
	if err := e.stopAPILocked(); err != nil {
		t.Errorf("podmantest cleanup: %v", err)
	}
	e.mu.Unlock()
	if err := e.teardown(t.Logf); err != nil {
		t.Errorf("podmantest cleanup: %v", err)
	}
	if e.owner != nil {
		e.owner.Close()
	}
}

// teardown removes the Env's containers, waits for (or kills) the
// processes working on its dir, unmounts what is left below it and
// removes it. Problems on the way are logged; only a dir that can't be
// removed is an error.
func (e *Env) teardown(logf func(string, ...any)) error {
	type proc struct{ pid, start int }
	var inits []proc
	if _, err := os.Stat(e.graphRoot); err == nil {
		// Init processes, to kill by hand should "rm -f" leave any.
		if out, err := e.Podman("ps", "--no-trunc", "--format", "{{.Pid}}"); err == nil {
			for _, f := range strings.Fields(out) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					if st, ok := startTime(pid); ok {
						inits = append(inits, proc{pid, st})
					}
				}
			}
		}
		if _, err := e.Podman("rm", "-f", "-a", "-t", "0"); err != nil {
			logf("podmantest cleanup: %v", err)
		}
	}
	// conmon runs "podman container cleanup" when a container exits; it
	// must be done before the dirs go, or it recreates them.
	if left := e.waitProcsGone(15 * time.Second); len(left) > 0 {
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		logf("podmantest cleanup: killed lingering processes %v", left)
		e.waitProcsGone(5 * time.Second)
	}
	for _, p := range inits {
		if st, ok := startTime(p.pid); ok && st == p.start {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			logf("podmantest cleanup: killed container init pid %d left by podman rm", p.pid)
		}
	}
	e.unmountAll(logf)
	return os.RemoveAll(e.dir)
}

// startTime is pid's start time in clock ticks; false when pid is gone or
// a zombie.
func startTime(pid int) (int, bool) {
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil || st.Zombie() {
		return 0, false
	}
	return int(st.StartTicks), true
}

// procsUsingDir lists processes whose argv mentions the Env's dir: the
// conmons of its containers, their exit commands, its API service.
func (e *Env) procsUsingDir() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	needle := []byte(e.dir + "/")
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, needle) {
			continue
		}
		if st, err := fingerprint.ReadStat("/proc", pid); err == nil && st.Zombie() {
			continue // zombie: already dead
		}
		pids = append(pids, pid)
	}
	return pids
}

func (e *Env) waitProcsGone(d time.Duration) []int {
	deadline := time.Now().Add(d)
	for {
		left := e.procsUsingDir()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unmountAll detaches every mount at or below the Env's dir, deepest
// first.
func (e *Env) unmountAll(logf func(string, ...any)) { UnmountBelow(e.dir, logf) }

// UnmountBelow detaches every mount at or below dir, deepest first: what a
// private podman (its storage, its containers' rootfs and shm) leaves
// mounted. Errors go to logf.
func UnmountBelow(dir string, logf func(string, ...any)) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		logf("podmantest cleanup: %v", err)
		return
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			logf("podmantest cleanup: umount %s: %v", mp, err)
		}
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
