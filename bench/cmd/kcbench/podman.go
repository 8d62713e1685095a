package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// privatePodman is a podman that shares nothing with the host's: its own
// containers.conf (runc, file locks, no events, cgroupfs, rlimits that
// work here), its own storage (vfs) and API socket, containers from a
// busybox rootfs with no network. The recipe is the one of
// internal/engine/podman/podman_test.go.
type privatePodman struct {
	bin, dir, root, runroot, rootfs, sock, conf string
	service                                     *child
	version                                     string
}

// podmanAvailable says why the podman part cannot run, or "".
func podmanAvailable() string {
	for _, b := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			return b + " not installed"
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return "no /bin/busybox for the container rootfs"
	}
	return ""
}

func newPrivatePodman(pop *population, dir string) (*privatePodman, error) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		return nil, err
	}
	p := &privatePodman{
		bin: bin, dir: dir,
		root:    filepath.Join(dir, "root"),
		runroot: filepath.Join(dir, "runroot"),
		rootfs:  filepath.Join(dir, "rootfs"),
		sock:    filepath.Join(dir, "podman.sock"),
		conf:    filepath.Join(dir, "containers.conf"),
	}
	for _, d := range []string{filepath.Join(p.rootfs, "bin"), filepath.Join(dir, "tmp"), "/run/podman"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(p.rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
tmp_dir = %q
lock_type = "file"
events_logger = "none"
cgroup_manager = "cgroupfs"
`, filepath.Join(dir, "tmp"))
	if err := os.WriteFile(p.conf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	// Registered before anything can be created in the store.
	pop.atCleanup(p.cleanup)
	if out, err := p.run(30*time.Second, "version", "--format", "{{.Client.Version}}"); err == nil {
		p.version = strings.TrimSpace(out)
	}
	return p, nil
}

// env is the environment for podman and for kc-janitor runs against it.
func (p *privatePodman) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CONTAINER_HOST=") || strings.HasPrefix(kv, "CONTAINERS_CONF=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "CONTAINERS_CONF="+p.conf)
}

func (p *privatePodman) globalArgs() []string {
	return []string{"--root", p.root, "--runroot", p.runroot, "--storage-driver", "vfs"}
}

// janitorCLIArgs are kc-janitor's --podman-arg flags naming the store.
func (p *privatePodman) janitorCLIArgs() []string {
	var out []string
	for _, a := range []string{"--root=" + p.root, "--runroot=" + p.runroot, "--storage-driver=vfs"} {
		out = append(out, "--podman-arg="+a)
	}
	return out
}

func (p *privatePodman) url() string { return "unix://" + p.sock }

func (p *privatePodman) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, append(p.globalArgs(), args...)...)
	cmd.Env = p.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("podman %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// serve starts `podman system service` (a child leading its own group,
// killed with it at cleanup) and waits for its socket.
func (p *privatePodman) serve(pop *population) error {
	argv := append([]string{p.bin}, p.globalArgs()...)
	argv = append(argv, "system", "service", "--time=0", p.url())
	c, err := pop.start("podman-service", argv, p.env(), newGroup)
	if err != nil {
		return err
	}
	p.service = c
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("unix", p.sock, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if pop.exited(c) {
			return fmt.Errorf("podman system service exited: %s", c.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("podman system service: socket not ready after 60s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runContainers starts n busybox containers (sleeping), a few at a time,
// and returns their IDs.
func (p *privatePodman) runContainers(n, parallel int) ([]string, error) {
	return startN(n, parallel, func() (string, error) {
		return p.run(3*time.Minute, "run", "-d", "--network", "none", "--rootfs", p.rootfs, "/bin/busybox", "sleep", "100000")
	})
}

// cleanup removes every container of the private store, waits for the
// asynchronous `podman container cleanup` processes to finish, stops the
// service and unmounts whatever is left below the directory. Never
// `podman system reset`.
func (p *privatePodman) cleanup() {
	if _, err := os.Stat(p.root); err == nil {
		if out, err := p.run(3*time.Minute, "rm", "--all", "--force", "--time", "0"); err != nil {
			fmt.Fprintf(os.Stderr, "kcbench: cleanup: %v %s\n", err, out)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		pids := processesNaming(p.dir, p.service)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "kcbench: cleanup: processes still using %s: %v\n", p.dir, pids)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p.service != nil && !p.service.reaped {
		syscall.Kill(-p.service.pid, syscall.SIGTERM)
		for i := 0; i < 100; i++ {
			var ws syscall.WaitStatus
			if wpid, _ := syscall.Wait4(p.service.pid, &ws, syscall.WNOHANG, nil); wpid == p.service.pid {
				p.service.reaped = true
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	podmantest.UnmountBelow(p.dir, func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kcbench: "+format+"\n", args...)
	})
}

// processesNaming lists live processes (other than the harness and the
// service) whose argv mentions s.
func processesNaming(s string, service *child) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || (service != nil && pid == service.pid) {
			continue
		}
		argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(argv, []byte(s)) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// fakePodmanCLI writes a stand-in `podman` that prints a fixed
// `podman ps --all --no-trunc --format json` listing (the live set) and
// returns a PATH that finds it first, and the URL of a dead API socket
// (a socket file nobody listens on, owned by root: the API attempt fails at
// once and the janitor's ground truth is root's, as with the real one).
// Used when real podman is off; its callers name a store with
// --podman-arg, as a CLI that reads its store directly is asked.
func fakePodmanCLI(dir string, live []string) (path, url string, err error) {
	bin := filepath.Join(dir, "fakebin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", "", err
	}
	sock := filepath.Join(dir, "podman.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return "", "", err
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	var b strings.Builder
	b.WriteString("[")
	for i, id := range live {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"Id":%q,"State":"running","Names":["c%d"]}`, id, i)
	}
	b.WriteString("]\n")
	list := filepath.Join(dir, "ps.json")
	if err := os.WriteFile(list, []byte(b.String()), 0o644); err != nil {
		return "", "", err
	}
	script := fmt.Sprintf("#!/bin/sh\n# stand-in for podman ps --all --no-trunc --format json\nexec cat %q\n", list)
	if err := os.WriteFile(filepath.Join(bin, "podman"), []byte(script), 0o755); err != nil {
		return "", "", err
	}
	return bin + ":" + os.Getenv("PATH"), "unix://" + sock, nil
}
