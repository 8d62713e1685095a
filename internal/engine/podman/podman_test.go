package podman

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
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

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// privatePodman is a podman that shares nothing with the host's: its own
// storage (--root/--runroot, vfs: no overlay mounts), its own tmp dir and
// file locks (not the host-wide /libpod_lock shm segment, which a fresh
// tmp dir's "refresh" would otherwise touch), no events, no network, runc.
// The test process's CONTAINERS_CONF points at its containers.conf, so the
// CLI fallback under test reads the same configuration.
type privatePodman struct {
	bin     string
	dir     string
	root    string
	runroot string
	rootfs  string
	sock    string
}

// needPodman skips (or fails, with KC_E2E=1) when real podman can't run.
func needPodman(t testing.TB) string {
	t.Helper()
	miss := func(why string) {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatalf("KC_E2E=1 but %s", why)
		}
		t.Skip(why)
	}
	bin, err := exec.LookPath("podman")
	if err != nil {
		miss("podman not installed")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		miss("runc not installed")
	}
	if os.Geteuid() != 0 {
		miss("needs root for a private rootful podman")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		miss("no /bin/busybox for the container rootfs")
	}
	return bin
}

func newPrivatePodman(t testing.TB) *privatePodman {
	t.Helper()
	bin := needPodman(t)
	dir := t.TempDir()
	p := &privatePodman{
		bin:     bin,
		dir:     dir,
		root:    filepath.Join(dir, "root"),
		runroot: filepath.Join(dir, "runroot"),
		rootfs:  filepath.Join(dir, "rootfs"),
		sock:    filepath.Join(dir, "podman.sock"),
	}
	for _, d := range []string{filepath.Join(p.rootfs, "bin"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "containers.conf")
	err = os.WriteFile(conf, fmt.Appendf(nil, `[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
tmp_dir = %q
lock_type = "file"
events_logger = "none"
cgroup_manager = "cgroupfs"
`, filepath.Join(dir, "tmp")), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONTAINERS_CONF", conf)
	// podman goes remote when CONTAINER_HOST is set at all, even empty.
	t.Setenv("CONTAINER_HOST", "")
	os.Unsetenv("CONTAINER_HOST")
	// Registered after t.TempDir, so it runs before the directory goes.
	t.Cleanup(func() { p.cleanup(t) })
	return p
}

// globalArgs address the private store from the CLI.
func (p *privatePodman) globalArgs() []string {
	return []string{"--root", p.root, "--runroot", p.runroot, "--storage-driver", "vfs"}
}

func (p *privatePodman) url() string { return "unix://" + p.sock }

// run runs the podman CLI on the private store and returns its stdout.
func (p *privatePodman) run(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, append(p.globalArgs(), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// serve starts `podman system service` on the private store and waits
// until its socket accepts connections.
func (p *privatePodman) serve(t testing.TB) {
	t.Helper()
	logf, err := os.Create(filepath.Join(p.dir, "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(p.bin, append(p.globalArgs(), "system", "service", "--time=0", p.url())...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The service's exit is seen without reaping it (WNOWAIT): unreaped,
	// its PID, and so its group's ID, cannot be another's when the
	// cleanup signals the group.
	exited := make(chan struct{})
	go func() {
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		close(exited)
	}()
	t.Cleanup(func() {
		// By PID (the service leads its own group): TERM, then KILL.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("unix", p.sock, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(p.dir, "service.log"))
			t.Fatalf("podman system service exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("podman system service: socket not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanup removes every container of the private store, then whatever is
// still mounted below the test directory.
func (p *privatePodman) cleanup(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := os.Stat(p.root); err == nil {
		out, err := exec.CommandContext(ctx, p.bin, append(p.globalArgs(), "rm", "--all", "--force", "--time", "0")...).CombinedOutput()
		if err != nil {
			t.Logf("cleanup: podman rm: %v: %s", err, out)
		}
	}
	// conmon runs `podman container cleanup` on the store after each
	// container dies, asynchronously: wait until no process names the test
	// directory any more, or it recreates files under it while it is being
	// removed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := processesNaming(p.dir)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("cleanup: processes still using %s: %v", p.dir, pids)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	podmantest.UnmountBelow(p.dir, t.Logf)
}

// processesNaming lists live processes whose argv mentions s.
func processesNaming(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(argv, []byte(s)) || proc.Dead(pid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

func TestQueryRealPodman(t *testing.T) {
	p := newPrivatePodman(t)
	p.serve(t)

	// One container per interesting raw state.
	ctr := func(verb string, cmd ...string) string {
		args := []string{verb}
		if verb == "run" {
			args = append(args, "-d")
		}
		args = append(args, "--network", "none", "--rootfs", p.rootfs, "/bin/busybox")
		id := p.run(t, append(args, cmd...)...)
		if !containerid.Valid(id) {
			t.Fatalf("podman %s printed %q, not a container ID", verb, id)
		}
		return id
	}
	running := ctr("run", "sleep", "1000")
	created := ctr("create", "sleep", "1000")
	paused := ctr("run", "sleep", "1000")
	p.run(t, "pause", paused)
	exited := ctr("run", "true")
	p.run(t, "wait", exited)
	stopped := ctr("run", "sleep", "1000")
	p.run(t, "stop", "--time", "0", stopped)
	t.Logf("running %s\ncreated %s\npaused  %s\nexited  %s\nstopped %s", running, created, paused, exited, stopped)

	wantLive := []string{running, created, paused}
	slices.Sort(wantLive)
	log := testLogger(t)

	check := func(name string, set engine.Set, src engine.Source) {
		t.Helper()
		t.Logf("%s: source %s, took %v, uid %d, states %v", name, set.Source, set.Took, set.UID, set.States)
		if set.Source != src {
			t.Errorf("%s: source = %s, want %s", name, set.Source, src)
		}
		if got := liveIDs(set.Live); !slices.Equal(got, wantLive) {
			t.Errorf("%s: live = %v, want %v", name, got, wantLive)
		}
		for _, id := range []string{exited, stopped} {
			if set.IsLive(id) {
				t.Errorf("%s: %s (%s) counted live", name, id, set.States[id])
			}
			if _, ok := set.States[id]; !ok {
				t.Errorf("%s: %s not listed", name, id)
			}
		}
		if len(set.States) != 5 {
			t.Errorf("%s: %d states, want 5", name, len(set.States))
		}
		if set.UID != 0 {
			t.Errorf("%s: uid = %d, want 0", name, set.UID)
		}
	}

	// The API.
	api, err := Query(t.Context(), Options{URL: p.url(), PodmanBin: filepath.Join(p.dir, "no-cli"), Timeout: 30 * time.Second, Logger: log})
	if err != nil {
		t.Fatalf("API query: %v", err)
	}
	check("api", api, engine.SourceAPI)
	if api.Endpoint != p.url() {
		t.Errorf("api endpoint = %q", api.Endpoint)
	}

	// The API asked about some containers: those of them it knows, as
	// the whole list has them, and no other; an ID prefix names the
	// containers it begins (engine.AskAbout takes only the IDs it asked).
	gone := strings.Repeat("0", 64)
	only, err := Query(t.Context(), Options{URL: p.url(), PodmanBin: filepath.Join(p.dir, "no-cli"), Timeout: 30 * time.Second, Logger: log,
		Only: []string{running, exited, gone, created[:12]}})
	if err != nil {
		t.Fatalf("API query about some: %v", err)
	}
	if !maps.Equal(only.States, map[string]string{running: "running", exited: "exited", created: "created"}) || !maps.Equal(only.Live, map[string]bool{running: true, created: true}) {
		t.Errorf("asked about %s, %s, an unknown one and %s's prefix: states %v, live %v", running, exited, created, only.States, only.Live)
	}
	// The engine asks so, through the API: a narrowed answer (not whole),
	// from where the whole list came; about an unknown container alone,
	// an empty list.
	e, err := New(engine.Config{PodmanURL: p.url(), PodmanBin: filepath.Join(p.dir, "no-cli"), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ids []string
		n   int
	}{{[]string{running}, 1}, {[]string{gone}, 0}} {
		a, whole, err := e.(engine.Narrower).LiveOf(t.Context(), tc.ids)
		if err != nil || whole || a.Source != engine.SourceAPI || a.Endpoint != api.Endpoint || a.UID != api.UID || len(a.Containers) != tc.n {
			t.Errorf("LiveOf(%v): %+v, whole %v, %v; want %d containers from %s", tc.ids, a, whole, err, tc.n, api.Endpoint)
		}
	}

	// The CLI on the same store (the API URL points nowhere; CLIArgs name
	// the store, as a caller with a private-storage service would).
	cli, err := Query(t.Context(), Options{
		URL:     "unix://" + filepath.Join(p.dir, "absent.sock"),
		CLIArgs: p.globalArgs(),
		Timeout: 30 * time.Second,
		Logger:  log,
	})
	if err != nil {
		t.Fatalf("CLI query: %v", err)
	}
	check("cli", cli, engine.SourceCLI)
	if !maps.Equal(api.States, cli.States) {
		t.Errorf("raw states differ:\napi %v\ncli %v", api.States, cli.States)
	}
	// The plain CLI's own arguments (it keeps to its own store even where
	// containers.conf says remote), on this store.
	local, err := queryCLI(t.Context(), p.bin, append(localArgs(), p.globalArgs()...), log)
	if err != nil {
		t.Fatalf("CLI %v query: %v", localArgs(), err)
	}
	if !maps.Equal(api.States, local.States) {
		t.Errorf("raw states differ:\napi   %v\nlocal %v", api.States, local.States)
	}

	// The CLI as a second client of the same service (what Query does by
	// itself for a non-default URL): podman --url … ps.
	ep, err := parseEndpoint(p.url())
	if err != nil {
		t.Fatal(err)
	}
	remote, err := queryCLI(t.Context(), p.bin, cliGlobalArgs(ep, nil), log)
	if err != nil {
		t.Fatalf("CLI --url query: %v", err)
	}
	remote.UID = 0 // the test's own rootful service
	check("cli --url", remote, engine.SourceCLI)
	if !maps.Equal(api.States, remote.States) {
		t.Errorf("raw states differ:\napi    %v\nremote %v", api.States, remote.States)
	}
}

// BenchmarkQuery times the API and the CLI path against a private podman
// holding a few containers.
func BenchmarkQuery(b *testing.B) {
	p := newPrivatePodman(b)
	p.serve(b)
	for range 3 {
		p.run(b, "run", "-d", "--network", "none", "--rootfs", p.rootfs, "/bin/busybox", "sleep", "1000")
	}
	p.run(b, "create", "--network", "none", "--rootfs", p.rootfs, "/bin/busybox", "true")
	for _, bc := range []struct {
		name string
		opt  Options
	}{
		{"api", Options{URL: p.url(), PodmanBin: filepath.Join(p.dir, "no-cli")}},
		{"cli", Options{URL: "unix://" + filepath.Join(p.dir, "absent.sock"), CLIArgs: p.globalArgs()}},
		{"cli-url", Options{URL: "unix://" + filepath.Join(p.dir, "absent.sock"), CLIArgs: []string{"--url", p.url()}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				set, err := Query(b.Context(), bc.opt)
				if err != nil || len(set.Live) != 4 {
					b.Fatalf("Query: %+v, %v", set, err)
				}
			}
		})
	}
}

// TestQueryStoreArgs: --podman-arg naming another store than
// the API service's makes the service's answer unusable: the
// CLI on the named store answers instead. The same store keeps the API.
// A symlink to the service's socket is refused.
func TestQueryStoreArgs(t *testing.T) {
	p := newPrivatePodman(t)
	p.serve(t)
	id := p.run(t, "run", "-d", "--network", "none", "--rootfs", p.rootfs, "/bin/busybox", "sleep", "1000")
	log := testLogger(t)

	same, err := Query(t.Context(), Options{URL: p.url(), CLIArgs: p.globalArgs(), Timeout: 30 * time.Second, Logger: log})
	if err != nil || same.Source != engine.SourceAPI || !same.IsLive(id) {
		t.Fatalf("same store: %+v, %v; want the API's answer", same, err)
	}

	other, err := os.MkdirTemp("", "kcst")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	args := []string{"--root", filepath.Join(other, "root"), "--runroot", filepath.Join(other, "runroot"), "--storage-driver", "vfs"}
	set, err := Query(t.Context(), Options{URL: p.url(), CLIArgs: args, Timeout: 30 * time.Second, Logger: log})
	if err != nil {
		t.Fatalf("other store: %v", err)
	}
	if set.Source != engine.SourceCLI || set.IsLive(id) {
		t.Fatalf("other store: source %s, live %v; want the CLI's answer about the named (empty) store", set.Source, set.Live)
	}

	link := filepath.Join(p.dir, "link.sock")
	if err := os.Symlink(p.sock, link); err != nil {
		t.Fatal(err)
	}
	_, err = Query(t.Context(), Options{URL: "unix://" + link, PodmanBin: filepath.Join(p.dir, "no-cli"), Timeout: 10 * time.Second, Logger: log})
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("symlinked socket: err = %v, want a refusal", err)
	}
}
