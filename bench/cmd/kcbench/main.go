// Command kcbench measures kc-watchman's scans, hook, reconcile and sweep
// side by side with the approaches of the seed scripts, on a host it fills
// with processes itself. See docs/PERFORMANCE.md.
//
// It must run as root, from the repository root, after `make build`:
//
//	go run ./bench/cmd/kcbench -n 1000,10000,30000
//
// Everything it starts is a direct child, killed and reaped by PID at the
// end, on SIGINT/SIGTERM/SIGHUP and on failure; kernel.pid_max is raised
// for the run when needed and restored.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

type config struct {
	ns          []int
	runs        int
	hookRuns    int
	janitorRuns int
	sweepRuns   int
	bin         string
	seed        string
	python      string
	filler      string
	fillerBin   string
	groupSizes  []int
	podman      string
	containers  int
	strays      int
	sweep       bool
	jsonOut     string
	mdOut       string
	keepTmp     bool
	hold        time.Duration

	dockerURL, dockerCLI, dockerImage string
	containerdAddr                    string
	deaths                            int
}

func main() {
	os.Exit(run())
}

var pop *population

func run() (code int) {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kcbench:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kcbench: run as root (it reads every process, signals trees and raises kernel.pid_max)")
		return 2
	}
	tmp, err := os.MkdirTemp("", "kcbench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kcbench:", err)
		return 1
	}
	pop, err = newPopulation(tmp, cfg.filler, cfg.fillerBin, cfg.groupSizes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kcbench:", err)
		return 1
	}
	if pop.hookBin, err = filepath.Abs(filepath.Join(cfg.bin, "kc-hook")); err != nil {
		fmt.Fprintln(os.Stderr, "kcbench:", err)
		return 1
	}
	if !cfg.keepTmp {
		pop.atCleanup(func() { os.RemoveAll(tmp) })
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "\nkcbench: %v: cleaning up\n", s)
		pop.cleanup()
		os.Exit(130)
	}()
	defer func() {
		if r := recover(); r != nil {
			pop.cleanup()
			panic(r)
		}
		pop.cleanup()
	}()

	b := &bench{cfg: cfg, tmp: tmp}
	if err := b.all(); err != nil {
		fmt.Fprintln(os.Stderr, "kcbench:", err)
		code = 1
	}
	b.report(os.Stdout)
	if cfg.mdOut != "" {
		if f, err := os.Create(cfg.mdOut); err == nil {
			b.report(f)
			f.Close()
		}
	}
	if cfg.jsonOut != "" {
		if data, err := json.MarshalIndent(b.res, "", "  "); err == nil {
			os.WriteFile(cfg.jsonOut, append(data, '\n'), 0o644)
		}
	}
	if len(b.res.Failures) > 0 && code == 0 {
		code = 1
	}
	return code
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("kcbench", flag.ContinueOnError)
	ns := fs.String("n", "1000,10000,30000", "process counts N for the host (comma-separated, ascending)")
	fs.IntVar(&c.runs, "runs", 7, "timed runs per scan method and N (medians are reported)")
	fs.IntVar(&c.hookRuns, "hook-runs", 9, "kc-hook poststop runs per variant and N")
	fs.IntVar(&c.janitorRuns, "janitor-runs", 5, "kc-janitor reconcile runs per path and N")
	fs.IntVar(&c.sweepRuns, "sweep-runs", 5, "kc-janitor sweep runs")
	fs.StringVar(&c.bin, "bin", "bin", "directory holding kc-hook and kc-janitor (make build)")
	fs.StringVar(&c.seed, "seed-script", "bench/seed_janitor.py", "the seed-approach scan script")
	fs.StringVar(&c.python, "python", "python3", "Python interpreter for the seed script")
	fs.StringVar(&c.filler, "filler", "auto", "filler processes: clone (clone(CLONE_VM) pausers, amd64), exec (fork+exec sleep) or auto")
	fs.StringVar(&c.fillerBin, "filler-bin", "/bin/busybox", "binary exec'd as `sleep 3600` for -filler exec")
	sizes := fs.String("group-sizes", "1,2,4,8", "filler process-group sizes, used in turn")
	fs.StringVar(&c.podman, "podman", "auto", "private podman for the reconcile runs: on, off or auto (on when podman, runc and /bin/busybox exist)")
	fs.IntVar(&c.containers, "containers", 50, "live containers (each with one supervisor tree)")
	fs.IntVar(&c.strays, "strays", 10, "stray supervisor trees (container gone)")
	fs.BoolVar(&c.sweep, "sweep", true, "benchmark kc-janitor sweep on 1000 sockets")
	fs.StringVar(&c.jsonOut, "json", "", "write all samples as JSON to `FILE`")
	fs.StringVar(&c.mdOut, "md", "", "also write the report to `FILE`")
	fs.BoolVar(&c.keepTmp, "keep-tmp", false, "keep the temp dir (logs) after the run")
	fs.StringVar(&c.dockerURL, "docker", "", "also reconcile through Docker Engine at `URL` (unix:///…, e.g. $KC_TEST_DOCKER_URL), with -containers live containers of its own")
	fs.StringVar(&c.dockerCLI, "docker-cli", "/usr/bin/docker", "docker CLI used to create and remove the -docker containers")
	fs.StringVar(&c.dockerImage, "docker-image", "kc-busybox", "local image with /bin/sleep for the -docker containers (no registry is asked)")
	fs.StringVar(&c.containerdAddr, "containerd", "", "also reconcile through containerd at socket `PATH` (e.g. $KC_TEST_CONTAINERD_ADDRESS), with -containers live containers in a namespace of its own")
	fs.IntVar(&c.deaths, "deaths", 20, "death to reap: containers per engine killed one at a time (p50, p95); the rest of each engine's -containers die together, as a burst; 0: no death phase")
	fs.DurationVar(&c.hold, "hold", 0, "after filling the host to the largest N, wait this long before measuring (for poking at it by hand)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.ns, err = intList(*ns); err != nil || len(c.ns) == 0 {
		return c, fmt.Errorf("-n: %q: want a comma-separated list of counts", *ns)
	}
	if !slices.IsSorted(c.ns) {
		return c, errors.New("-n: counts must be ascending (processes are only ever added)")
	}
	if c.groupSizes, err = intList(*sizes); err != nil || len(c.groupSizes) == 0 || slices.Min(c.groupSizes) < 1 {
		return c, fmt.Errorf("-group-sizes: %q", *sizes)
	}
	switch c.filler {
	case "auto":
		c.filler = "exec"
		if haveCloneFiller {
			c.filler = "clone"
		}
	case "clone":
		if !haveCloneFiller {
			return c, errors.New("-filler clone needs amd64")
		}
	case "exec":
	default:
		return c, fmt.Errorf("-filler: %q: want clone, exec or auto", c.filler)
	}
	if c.deaths < 0 {
		return c, errors.New("-deaths must not be negative")
	}
	if c.runs < 1 || c.hookRuns < 1 || c.janitorRuns < 1 || c.sweepRuns < 1 {
		return c, errors.New("run counts must be positive")
	}
	return c, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		f = strings.ReplaceAll(f, "_", "")
		mult := 1
		if strings.HasSuffix(f, "k") {
			f, mult = strings.TrimSuffix(f, "k"), 1000
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v*mult)
	}
	return out, nil
}

// bench holds the run's state and results.
type bench struct {
	cfg      config
	tmp      string
	kcserver string
	hookBin  string
	janitor  string
	python   string
	comms    []string
	pm       *privatePodman
	docker   *benchDocker
	ctrd     *benchContainerd
	liveIDs  []string
	strayIDs []string
	// engineIDs are the live containers of the other engines (docker,
	// containerd), each with a supervisor tree like podman's.
	engineIDs map[string][]string
	planted   []pair // the supervisor trees the harness started (signalable)
	known     map[trees.Key]string
	janEnv    []string
	janArgs   map[string][]string // path → extra reconcile args
	res       results
}

func (b *bench) fail(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintln(os.Stderr, "kcbench: FAIL:", msg)
	b.res.Failures = append(b.res.Failures, msg)
}

func (b *bench) note(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintln(os.Stderr, "kcbench:", msg)
	b.res.Notes = append(b.res.Notes, msg)
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "kcbench: "+format+"\n", a...)
}

func (b *bench) all() error {
	b.comms = []string{"kcserver"}
	b.res.Command = "go run ./bench/cmd/kcbench " + strings.Join(os.Args[1:], " ")
	if err := b.preflight(); err != nil {
		return err
	}
	b.linkCheck()
	if b.cfg.sweep {
		if err := b.sweepBench(); err != nil {
			b.fail("sweep: %v", err)
		}
	}
	if err := b.setupLiveness(); err != nil {
		return err
	}
	if err := b.setupEngines(); err != nil {
		return err
	}
	if err := b.plant(); err != nil {
		return err
	}
	for _, n := range b.cfg.ns {
		if err := b.atN(n); err != nil {
			return err
		}
	}
	if b.cfg.deaths > 0 {
		b.deathBench()
	}
	b.targets()
	return nil
}

// preflight checks the tools, records the machine and raises pid_max.
func (b *bench) preflight() error {
	b.hookBin = filepath.Join(b.cfg.bin, "kc-hook")
	b.janitor = filepath.Join(b.cfg.bin, "kc-janitor")
	for _, p := range []string{b.hookBin, b.janitor} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %v (run `make build` first)", p, err)
		}
	}
	var err error
	for _, p := range []*string{&b.hookBin, &b.janitor, &b.cfg.seed} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if _, err := os.Stat(b.cfg.seed); err != nil {
		return fmt.Errorf("seed script: %v", err)
	}
	if _, err := exec.LookPath("ps"); err != nil {
		return errors.New("ps not installed (procps)")
	}
	py, pyver, err := pythonExecutable(b.cfg.python)
	if err != nil {
		return err
	}
	b.python = py

	m := map[string]string{}
	m["kernel"] = strings.TrimSpace(readFile("/proc/sys/kernel/osrelease"))
	m["cpu"] = cpuModel()
	m["cores"] = strconv.Itoa(runtime.NumCPU())
	m["memory"] = memTotal()
	m["go"] = runtime.Version()
	m["python"] = pyver
	if out, err := exec.Command("ps", "--version").Output(); err == nil {
		m["ps"] = strings.TrimSpace(string(out))
	}
	m["filler"] = b.cfg.filler
	m["group_sizes"] = fmt.Sprint(b.cfg.groupSizes)
	m["baseline_processes"] = strconv.Itoa(countProcesses())
	m["loadavg_at_start"] = loadavg()
	b.res.Machine = m

	maxN := slices.Max(b.cfg.ns)
	if err := b.raisePidMax(maxN); err != nil {
		return err
	}
	tm, _ := strconv.Atoi(strings.TrimSpace(readFile("/proc/sys/kernel/threads-max")))
	if tm > 0 && tm < maxN+20000 {
		b.note("kernel.threads-max is %d; N=%d may not fit", tm, maxN)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(6 /* RLIMIT_NPROC */, &rl); err == nil {
		m["rlimit_nproc"] = fmt.Sprintf("%d/%d (not enforced for root)", rl.Cur, rl.Max)
	}
	if pm := strings.TrimSpace(readFile("/sys/fs/cgroup/pids/pids.max")); pm != "" {
		m["cgroup_pids_max"] = pm
	}

	progress("building the fake supervisor (internal/testutil/kcserver) and the rusage helper (bench/cmd/rusage)")
	b.kcserver = filepath.Join(b.tmp, "bin", "kcserver")
	rusageBin = filepath.Join(b.tmp, "bin", "rusage")
	for out, pkg := range map[string]string{b.kcserver: "./internal/testutil/kcserver", rusageBin: "./bench/cmd/rusage"} {
		if err := testutil.GoBuild(pkg, out); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) raisePidMax(maxN int) error {
	const path = "/proc/sys/kernel/pid_max"
	old := strings.TrimSpace(readFile(path))
	cur, err := strconv.Atoi(old)
	if err != nil {
		return fmt.Errorf("reading %s: %q", path, old)
	}
	b.res.Machine["pid_max"] = old
	want := 4 * (maxN + 5000)
	if want < 131072 {
		want = 131072
	}
	if want > 4194304 {
		want = 4194304
	}
	if cur >= want {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return fmt.Errorf("raising %s to %d: %w", path, want, err)
	}
	b.res.Machine["pid_max"] = fmt.Sprintf("%s (raised to %d for the run, restored after)", old, want)
	pop.atCleanup(func() {
		if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "kcbench: restoring %s to %s: %v\n", path, old, err)
		}
	})
	return nil
}

// linkCheck verifies that kc-hook links no podman module, and counts what
// it links.
func (b *bench) linkCheck() {
	l := &b.res.Link
	if out, err := exec.Command("go", "version", "-m", b.hookBin).Output(); err == nil {
		l.VersionM = !strings.Contains(string(out), "containers/podman") && !strings.Contains(string(out), "go.podman.io")
		l.Modules = strings.Count(string(out), "\tdep\t")
		l.VersionMChecked = true
	} else {
		l.Error = err.Error()
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/kc-hook")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.Output(); err == nil {
		l.ListDeps = !strings.Contains(string(out), "github.com/containers/podman") && !strings.Contains(string(out), "go.podman.io")
		l.Packages = strings.Count(string(out), "\n")
		l.ListDepsChecked = true
	} else {
		l.Error = err.Error()
	}
	if fi, err := os.Stat(b.hookBin); err == nil {
		l.HookBytes = fi.Size()
	}
	if fi, err := os.Stat(b.janitor); err == nil {
		l.JanitorBytes = fi.Size()
	}
}

// setupLiveness starts the private podman with the live containers, or
// (without podman) a stand-in podman CLI that lists random live IDs.
func (b *bench) setupLiveness() error {
	mode := b.cfg.podman
	if mode == "auto" {
		mode = "on"
		if why := podmanAvailable(); why != "" {
			b.note("podman part off: %s", why)
			mode = "off"
		}
	}
	b.janArgs = map[string][]string{}
	for range b.cfg.strays {
		b.strayIDs = append(b.strayIDs, randomID())
	}
	if mode == "on" {
		if why := podmanAvailable(); why != "" {
			return fmt.Errorf("-podman on: %s", why)
		}
		progress("starting a private podman with %d containers", b.cfg.containers)
		start := time.Now()
		pm, err := newPrivatePodman(pop, filepath.Join(b.tmp, "podman"))
		if err != nil {
			return err
		}
		b.pm = pm
		if err := pm.serve(pop); err != nil {
			return err
		}
		ids, err := pm.runContainers(b.cfg.containers, 4)
		if err != nil {
			return err
		}
		b.liveIDs = ids
		b.res.Machine["podman"] = pm.version + " (private: runc, vfs, --network none, busybox rootfs)"
		b.res.PodmanSetup = time.Since(start)
		b.janEnv = pm.env()
		b.janArgs["api"] = []string{"--engine", "podman", "--podman-url", pm.url()}
		b.janArgs["cli"] = append([]string{"--engine", "podman", "--podman-url", "unix://" + filepath.Join(pm.dir, "absent.sock")}, pm.janitorCLIArgs()...)
		progress("podman ready after %v", b.res.PodmanSetup.Round(time.Millisecond))
		return nil
	}
	for range b.cfg.containers {
		b.liveIDs = append(b.liveIDs, randomID())
	}
	path, url, err := fakePodmanCLI(filepath.Join(b.tmp, "fakepodman"), b.liveIDs)
	if err != nil {
		return err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "CONTAINER_HOST=") {
			env = append(env, kv)
		}
	}
	b.janEnv = append(env, "PATH="+path)
	// --podman-arg makes the stand-in's answer the store's own (the CLI
	// read it directly): through --url alone it would vouch for no UID
	// (issue 16), and every tree would be skipped-other-uid.
	b.janArgs["fake-cli"] = []string{"--engine", "podman", "--podman-url", url, "--podman-arg=--root=" + filepath.Join(b.tmp, "fakepodman", "store")}
	b.res.Machine["podman"] = "off: a stand-in `podman` script lists the live set"
	return nil
}

// plant starts the supervisor trees (one per live container plus the
// strays) and the decoys that exercise the other decisions.
func (b *bench) plant() error {
	sock := filepath.Join(b.tmp, "sock-trees")
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return err
	}
	ids := append(b.allLive(), b.strayIDs...)
	progress("starting %d supervisor trees (fake kcserver + 2 children each) and decoys", len(ids))
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, _, err := pop.startKCServer(b.kcserver, "tree", id, []string{"KCFAKE_CHILDREN=2"}, "--socket-dir="+sock)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			b.planted = append(b.planted, pair{c.pid, id})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	sortPairs(b.planted)

	// An anchor that is never a supervisor (podman's conmon carries the
	// container ID too): the fake under another name.
	conmon := filepath.Join(b.tmp, "decoy", "conmon")
	if err := os.MkdirAll(filepath.Dir(conmon), 0o755); err != nil {
		return err
	}
	if err := testutil.CopyFile(b.kcserver, conmon, 0o755); err != nil {
		return err
	}
	// Its wrapper makes a tree of the container it names: a stray's, or
	// with -strays 0 a live one's, so that the run has no stray at all.
	decoyID := randomID()
	if all := append(slices.Clone(b.strayIDs), b.allLive()...); len(all) > 0 {
		decoyID = all[0]
	}
	if _, _, err := pop.startKCServer(conmon, "decoy-conmon", decoyID, nil, "--socket-dir="+sock); err != nil {
		return err
	}
	// A supervisor without a container ID (a desktop Positron's).
	if _, _, err := pop.startKCServer(b.kcserver, "decoy-desktop", "", []string{"KCFAKE_CHILDREN=1"}, "--socket-dir="+sock); err != nil {
		return err
	}
	// A foreign group: a shell leads a group holding a supervisor.
	ready := filepath.Join(b.tmp, "ready-foreign")
	sh := fmt.Sprintf("KCFAKE_CHILDREN=1 KCFAKE_READY_FILE=%s %s --transport=socket --socket-dir=%s & sh -c 'sleep 1000000; :' anchor %s & wait", ready, b.kcserver, sock, randomID())
	fc, err := pop.start("decoy-foreign", []string{"/bin/sh", "-c", sh}, nil, newGroup)
	if err != nil {
		return err
	}
	if err := waitFile(ready, 30*time.Second); err != nil {
		return fmt.Errorf("foreign decoy: %v: %s", err, fc.logTail())
	}
	// A crashed supervisor: its wrapper SIGKILLed and kcserver gone, the kernels live on in
	// its group with nothing tying them to the container but the ledger's
	// identities (passed to the in-process scans as Known).
	// Its cgroup, kept, is a gone container's to sweep; with -strays 0 a
	// live one's, so that a run has nothing to act on (with several
	// engines: the last's, which paths scoped to another do not see).
	crashedID := randomID()
	if live := b.allLive(); len(b.strayIDs) == 0 && len(live) > 0 {
		crashedID = live[len(live)-1]
	}
	cc, kc, err := pop.startKCServer(b.kcserver, "decoy-crashed", crashedID, []string{"KCFAKE_CHILDREN=2"}, "--socket-dir="+sock)
	if err != nil {
		return err
	}
	// SIGKILL to the wrapper (our unreaped child: its PID is still ours)
	// takes the fake down by its parent-death signal; the kernels stay.
	syscall.Kill(cc.pid, syscall.SIGKILL)
	for i := 0; ; i++ {
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, kc)
		w, errW := fingerprint.ReadStat(fingerprint.DefaultRoot, cc.pid)
		if (err != nil || st.Zombie()) && errW == nil && w.Zombie() {
			break
		}
		if i > 3000 {
			return errors.New("crashed decoy: kcserver did not die")
		}
		time.Sleep(time.Millisecond)
	}
	b.known = map[trees.Key]string{}
	for _, st := range groupMembers(cc.pid) {
		b.known[trees.Key{PID: st.PID, StartTicks: st.StartTicks, PGID: cc.pid}] = crashedID
	}
	if len(b.known) != 2 {
		return fmt.Errorf("crashed decoy: %d children found, want 2", len(b.known))
	}
	return nil
}

func waitFile(p string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if data, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(data))) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not written after %v", p, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readFile(p string) string {
	data, _ := os.ReadFile(p)
	return string(data)
}

func cpuModel() string {
	for _, l := range strings.Split(readFile("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	for _, l := range strings.Split(readFile("/proc/meminfo"), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "?"
}
