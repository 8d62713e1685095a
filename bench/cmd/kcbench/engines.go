package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// Engine paths: reconcile asked through Docker Engine's API and through
// containerd's, next to podman's, each with its own live containers on
// the private daemons the CI starts (.ci/lib/dockerd.sh,
// .ci/lib/containerd.sh). Everything created here carries this run's
// label or namespace and is removed at cleanup, by ID; other users'
// containers on the same daemons are never touched.

// benchDocker is a dockerd the harness adds containers to.
type benchDocker struct {
	url, cli, image, config, label string
	mu                             sync.Mutex
	ids                            []string
}

func newBenchDocker(url, cli, image, dir string) (*benchDocker, error) {
	d := &benchDocker{url: url, cli: cli, image: image, config: filepath.Join(dir, "docker-config"),
		label: "io.kc-watchman.kcbench=" + filepath.Base(dir)}
	if err := os.MkdirAll(d.config, 0o700); err != nil {
		return nil, err
	}
	pop.atCleanup(d.cleanup)
	if _, err := d.run(30*time.Second, "image", "inspect", "--format", "{{.Id}}", image); err != nil {
		return nil, fmt.Errorf("docker image %s: %w", image, err)
	}
	return d, nil
}

func (d *benchDocker) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cli, append([]string{"-H", d.url}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+d.config)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// runningAPI lists the running containers over the API socket: a CLI
// run every few milliseconds would take the CPU the reaping is timed on.
func (d *benchDocker) runningAPI() (map[string]bool, error) {
	sock, ok := strings.CutPrefix(d.url, "unix://")
	if !ok {
		return nil, fmt.Errorf("docker URL %s: not unix://", d.url)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://docker/v1.41/containers/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("docker containers/json: %s", resp.Status)
	}
	var list []struct {
		ID string `json:"Id"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, c := range list {
		out[c.ID] = true
	}
	return out, nil
}

// version is dockerd's, for the machine table.
func (d *benchDocker) version() string {
	v, err := d.run(30*time.Second, "version", "--format", "{{.Server.Version}} (API {{.Server.APIVersion}})")
	if err != nil {
		return "?"
	}
	return v
}

// runContainers starts n containers running sleep, a few at a time.
func (d *benchDocker) runContainers(n, parallel int) ([]string, error) {
	return startN(n, parallel, func() (string, error) {
		id, err := d.run(2*time.Minute, "run", "-d", "--network", "none", "--label", d.label, d.image, "/bin/sleep", "100000")
		if err == nil {
			d.mu.Lock()
			d.ids = append(d.ids, id)
			d.mu.Unlock()
		}
		return id, err
	})
}

// cleanup removes this run's containers: the IDs it got back, and any
// carrying its label (a run killed between create and its answer).
func (d *benchDocker) cleanup() {
	ids := append([]string{}, d.ids...)
	if out, err := d.run(time.Minute, "ps", "-aq", "--no-trunc", "--filter", "label="+d.label); err == nil {
		for _, id := range strings.Fields(out) {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 50)]
		ids = ids[len(batch):]
		if _, err := d.run(3*time.Minute, append([]string{"rm", "-f"}, batch...)...); err != nil && !strings.Contains(err.Error(), "No such container") {
			fmt.Fprintf(os.Stderr, "kcbench: cleanup: %v\n", err)
		}
	}
}

// benchContainerd is a containerd the harness adds containers to, in a
// namespace of its own.
type benchContainerd struct {
	addr, ns string
	mu       sync.Mutex
	ids      []string
}

func newBenchContainerd(addr, dir string) (*benchContainerd, error) {
	if _, err := exec.LookPath("ctr"); err != nil {
		return nil, fmt.Errorf("containerd: %w", err)
	}
	c := &benchContainerd{addr: addr, ns: "kcbench-" + randomID()[:12]}
	pop.atCleanup(c.cleanup)
	archive, err := containerdtest.Archive()
	if err != nil {
		return nil, fmt.Errorf("building the busybox image: %w", err)
	}
	if _, err := containerdtest.TryCtr(addr, c.ns, archive, "images", "import", "-"); err != nil {
		return nil, fmt.Errorf("ctr -n %s images import: %w", c.ns, err)
	}
	return c, nil
}

func (c *benchContainerd) version() string {
	out, err := containerdtest.TryCtr(c.addr, c.ns, nil, "version")
	if err != nil {
		return "?"
	}
	// The server's block comes second: "Server:\n  Version:  1.6.20~ds1".
	if _, server, ok := strings.Cut(out, "Server:"); ok {
		for _, l := range strings.Split(server, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "?"
}

func (c *benchContainerd) runContainers(n, parallel int) ([]string, error) {
	return startN(n, parallel, func() (string, error) {
		id := randomID()
		c.mu.Lock()
		c.ids = append(c.ids, id)
		c.mu.Unlock()
		_, err := containerdtest.TryCtr(c.addr, c.ns, nil, "run", "-d", "--null-io", containerdtest.ImageName, id, "/bin/sleep", "100000")
		return id, err
	})
}

// cleanup removes this run's containers, its image and its namespace.
func (c *benchContainerd) cleanup() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, id := range c.ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			containerdtest.Remove(c.addr, c.ns, id)
		}()
	}
	wg.Wait()
	containerdtest.RemoveNamespaceCgroups(c.ns) // once the last container's is gone
	if out, err := containerdtest.TryCtr(c.addr, c.ns, nil, "images", "ls", "-q"); err == nil {
		for _, img := range strings.Fields(out) {
			containerdtest.TryCtr(c.addr, c.ns, nil, "images", "rm", img)
		}
	}
	// containerd collects the image's blobs and snapshots in the
	// background; the namespace can go once they are gone.
	var err error
	for range 600 {
		if _, err = containerdtest.TryCtr(c.addr, c.ns, nil, "namespaces", "rm", c.ns); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "kcbench: cleanup: containerd namespace %s: %v\n", c.ns, err)
}

// startN runs start n times, parallel at once, and collects the container
// IDs it returns; each must be a full container ID.
func startN(n, parallel int, start func() (string, error)) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id, err := start()
			if err == nil && !containerid.Valid(id) {
				err = fmt.Errorf("started %q, not a container ID", id)
			}
			ids[i], errs[i] = id, err
		}()
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// setupEngines starts the Docker and containerd containers asked for
// with -docker and -containerd, and the reconcile paths that ask them.
func (b *bench) setupEngines() error {
	b.engineIDs = map[string][]string{}
	if b.cfg.dockerURL != "" {
		progress("starting %d containers on dockerd %s", b.cfg.containers, b.cfg.dockerURL)
		start := time.Now()
		d, err := newBenchDocker(b.cfg.dockerURL, b.cfg.dockerCLI, b.cfg.dockerImage, b.tmp)
		if err != nil {
			return err
		}
		ids, err := d.runContainers(b.cfg.containers, 4)
		if err != nil {
			return err
		}
		b.engineIDs["docker"], b.docker = ids, d
		b.janArgs["docker"] = []string{"--engine", "docker", "--docker-url", b.cfg.dockerURL}
		b.res.Machine["docker"] = d.version() + " (private dockerd; containers: " + b.cfg.dockerImage + " /bin/sleep, --network none)"
		progress("docker containers ready after %v", time.Since(start).Round(time.Millisecond))
	}
	if b.cfg.containerdAddr != "" {
		progress("starting %d containers on containerd %s", b.cfg.containers, b.cfg.containerdAddr)
		start := time.Now()
		c, err := newBenchContainerd(b.cfg.containerdAddr, b.tmp)
		if err != nil {
			return err
		}
		ids, err := c.runContainers(b.cfg.containers, 4)
		if err != nil {
			return err
		}
		b.engineIDs["containerd"], b.ctrd = ids, c
		b.janArgs["containerd"] = []string{"--engine", "containerd", "--containerd-address", b.cfg.containerdAddr, "--containerd-namespace", c.ns}
		b.res.Machine["containerd"] = c.version() + " (private containerd; namespace " + c.ns + ", busybox /bin/sleep via ctr run)"
		progress("containerd containers ready after %v", time.Since(start).Round(time.Millisecond))
	}
	b.askAll()
	return nil
}

// askAll adds the path "all": one reconcile asking every engine the
// harness runs, as --engine auto does on a host that has them all, so
// that each engine's live containers are live to it and none is read as
// another engine's stray.
func (b *bench) askAll() {
	var engines []string
	var args []string
	if pm, ok := b.janArgs["api"]; ok {
		engines = append(engines, "podman")
		args = append(args, pm[2:]...) // after "--engine podman"
	}
	for _, e := range []string{"docker", "containerd"} {
		if a, ok := b.janArgs[e]; ok {
			engines = append(engines, e)
			args = append(args, a[2:]...)
		}
	}
	if len(engines) < 2 {
		return
	}
	b.janArgs["all"] = append([]string{"--engine", strings.Join(engines, ",")}, args...)
}

// pathEngine is the engine a reconcile path asks.
func pathEngine(path string) string {
	switch path {
	case "docker", "containerd":
		return path
	}
	return "podman"
}

// liveFor are the container IDs the engine of path lists live.
func (b *bench) liveFor(path string) []string {
	if path == "all" {
		out := slices.Clone(b.engineIDs["docker"])
		out = append(out, b.engineIDs["containerd"]...)
		if _, ok := b.janArgs["api"]; ok { // else podman's are the stand-in CLI's
			out = append(out, b.liveIDs...)
		}
		return out
	}
	if e := pathEngine(path); e != "podman" {
		return b.engineIDs[e]
	}
	return b.liveIDs
}

// allLive are every engine's live container IDs (each has a tree).
func (b *bench) allLive() []string {
	out := append([]string{}, b.liveIDs...)
	for _, e := range []string{"docker", "containerd"} {
		out = append(out, b.engineIDs[e]...)
	}
	return out
}

// reconcileAt is the reconcile result of path at n, or nil.
func (b *bench) reconcileAt(n int, path string) *reconcileResult {
	for i := range b.res.Reconciles {
		if rr := &b.res.Reconciles[i]; rr.N == n && rr.Path == path {
			return rr
		}
	}
	return nil
}

// engineTable puts the engines' reconcile times side by side at each N,
// with the ratio to the podman API path's.
func (b *bench) engineTable(w io.Writer) {
	if len(b.engineIDs) == 0 {
		return
	}
	paths := []string{"api", "cli", "docker", "containerd"}
	fmt.Fprintf(w, "### reconcile by engine (dry run; %d live containers per engine, each with a tree, + %d strays, all on the host at once; each path asks its engine alone, limited with --container to that engine's trees and the strays; median wall (CPU) of %d runs)\n\n",
		b.cfg.containers, len(b.strayIDs), b.cfg.janitorRuns)
	fmt.Fprintln(w, "| N (processes) | podman API | podman CLI | Docker | containerd | Docker / podman API | containerd / podman API | load after |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, n := range b.cfg.ns {
		api := b.reconcileAt(n, "api")
		if api == nil {
			continue
		}
		row := fmt.Sprintf("| %d (%d) |", n, api.Processes)
		load := ""
		for _, p := range paths {
			rr := b.reconcileAt(n, p)
			if rr == nil {
				row += " — |"
				continue
			}
			row += fmt.Sprintf(" %s (%s) |", ms(rr.Wall.wall()), ms(rr.Wall.cpu()))
			load = rr.Load
		}
		for _, p := range []string{"docker", "containerd"} {
			if rr := b.reconcileAt(n, p); rr != nil {
				row += fmt.Sprintf(" %.2f× |", ratio(rr.Wall.wall(), api.Wall.wall()))
			} else {
				row += " — |"
			}
		}
		fmt.Fprintf(w, "%s %s |\n", row, load)
	}
	fmt.Fprintln(w)
}

// engineTargets: reconcile through Docker at 10k within 1.5× the podman
// API path's time (issue 14); containerd alongside for comparison.
func (b *bench) engineTargets() {
	api := b.reconcileAt(10000, "api")
	if api == nil {
		return
	}
	if d := b.reconcileAt(10000, "docker"); d != nil {
		r := ratio(d.Wall.wall(), api.Wall.wall())
		b.res.Targets = append(b.res.Targets, target{What: fmt.Sprintf("reconcile at 10k, %d live Docker containers vs %d live podman containers (API)", b.cfg.containers, b.cfg.containers),
			Goal: "≤ 1.5× podman API", Measured: fmt.Sprintf("%.2f× (%s vs %s wall)", r, ms(d.Wall.wall()), ms(api.Wall.wall())), Met: r <= 1.5})
	}
	if c := b.reconcileAt(10000, "containerd"); c != nil {
		r := ratio(c.Wall.wall(), api.Wall.wall())
		b.res.Targets = append(b.res.Targets, target{What: fmt.Sprintf("for comparison: reconcile at 10k with %d live containerd containers", b.cfg.containers),
			Goal: "—", Measured: fmt.Sprintf("%.2f× the podman API path (%s vs %s wall)", r, ms(c.Wall.wall()), ms(api.Wall.wall())), Comparison: true})
	}
}

// containerFilter limits a reconcile path to the trees of its engine's
// containers and the strays when other engines' containers run too:
// asked alone, an engine does not list the others' containers, and their
// live conmon or containerd-shim (carrying the ID) contradicts its answer
// for their trees — exit 3, nothing touched (DESIGN "Ground truth must be corroborated"), which is right
// but measures nothing. Every path gets the same filter.
func (b *bench) containerFilter(path string) []string {
	if len(b.engineIDs) == 0 {
		return nil
	}
	var out []string
	for _, id := range append(append([]string{}, b.liveFor(path)...), b.strayIDs...) {
		out = append(out, "--container", id)
	}
	return out
}
