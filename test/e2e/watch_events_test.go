package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// watchProc is a `kc-janitor watch` running in the background, logging
// JSON lines to its own file.
type watchProc struct {
	log    string
	stderr bytes.Buffer
}

// startWatch runs watch with args (--interval 1h: only the first round
// runs, everything after it comes from the events) and stops it with
// SIGTERM when the test ends.
func startWatch(t testing.TB, args ...string) *watchProc {
	t.Helper()
	w := &watchProc{log: filepath.Join(t.TempDir(), "watch.log")}
	args = append([]string{"watch", "--interval", "1h", "--no-cull", "--socket-dir", t.TempDir(),
		"--state-dir", t.TempDir(), "--kill-grace", "500ms", "--log-level", "debug",
		"--log-file", w.log, "--log-format", "json"}, args...)
	cmd := exec.Command(bin(t, "kc-janitor"), args...)
	cmd.Stderr = &w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("watch did not stop on SIGTERM")
		}
		if t.Failed() {
			data, _ := os.ReadFile(w.log)
			t.Logf("watch log:\n%s\nstderr: %s", data, w.stderr.String())
		}
	})
	return w
}

// lines returns the log lines whose fields include every field of want.
func (w *watchProc) lines(want map[string]any) []map[string]any {
	data, err := os.ReadFile(w.log)
	if err != nil {
		return nil
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		ok := true
		for k, v := range want {
			if l[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// waitLine polls until a line matching want is logged.
func (w *watchProc) waitLine(t testing.TB, want map[string]any) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ls := w.lines(want); len(ls) > 0 {
			return ls[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch logged no line with %v within 30s", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until watch follows engine's deaths and has finished
// its first round (so a tree it reaps later was reaped from an event).
func (w *watchProc) waitReady(t testing.TB, engine string) {
	t.Helper()
	w.waitLine(t, map[string]any{"msg": "following container deaths", "engine": engine})
	w.waitLine(t, map[string]any{"msg": "reconcile", "step": "reconcile"})
}

// deathsHandled reads watch's handled-deaths gauge for engine from the
// metrics file (-1 when absent).
func deathsHandled(t *testing.T, path, engine string) float64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fams, err := metrics.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if f := fams[metrics.WatchDeathsHandled]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "engine" && l.GetValue() == engine {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// TestWatchDockerDeathEvents: with --interval 1h, watch reaps the tree of a
// container killed with `docker kill` from its "die" event alone, and the
// tree of a container that keeps running is not touched. A dry run only
// logs would-reap; --no-events --no-pidfd leaves the tree for the next
// round (--no-events alone still sees the death through the init's pidfd).
func TestWatchDockerDeathEvents(t *testing.T) {
	dt := dockertest.Need(t)
	const comm = "kcsrv-e2e-wdk"
	engine := []string{"--engine", "docker", "--docker-url", dt.URL, "--supervisor-comm", comm, "--min-age", "0s"}

	t.Run("killed container reaped and live one untouched", func(t *testing.T) {
		live, victim := dt.Run(t, nil), dt.Run(t, nil)
		_, liveTree := startTree(t, t.TempDir(), live, testutil.Fake{Comm: comm})
		_, victimTree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
		mf := filepath.Join(t.TempDir(), "kc.prom")
		w := startWatch(t, append(engine, "--reconcile-apply", "--metrics-file", mf, "--container", live, "--container", victim)...)
		w.waitReady(t, "docker")
		if len(aliveOf(victimTree)) != len(victimTree) {
			t.Fatal("the first round touched a running container's tree")
		}

		dt.Must(t, "kill", victim)
		waitAllDead(t, victimTree, 20*time.Second)
		l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
		t.Logf("death line: %v", l)
		if l["reaped"] != float64(1) || l["engine"] != "docker" {
			t.Errorf("death line %v, want one tree reaped, reported by docker", l)
		}
		if len(aliveOf(liveTree)) != len(liveTree) {
			t.Fatal("the live container's tree lost a member when another container died")
		}
		if n := len(w.lines(map[string]any{"msg": "reconcile", "step": "reconcile"})); n != 1 {
			t.Errorf("%d rounds ran, want only the first: the reap was not the event's", n)
		}
		// Written after each handled death, next to the round's series.
		if v := deathsHandled(t, mf, "docker"); v != 1 {
			t.Errorf("%s{engine=docker} = %v, want 1", metrics.WatchDeathsHandled, v)
		}
	})

	t.Run("one death reported by docker and containerd is handled once", func(t *testing.T) {
		// dockerd's own containerd (.ci/lib/dockerd.sh: under its exec
		// root), where Docker's containers are tasks in namespace moby.
		sock := filepath.Join(filepath.Dir(strings.TrimPrefix(dt.URL, "unix://")), "exec", "containerd", "containerd.sock")
		if _, err := os.Stat(sock); err != nil {
			t.Skipf("no containerd of the private dockerd's at %s: %v", sock, err)
		}
		victim := dt.Run(t, nil)
		_, tree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
		w := startWatch(t, "--engine", "docker,containerd", "--docker-url", dt.URL, "--containerd-address", sock,
			"--containerd-namespace", "moby", "--supervisor-comm", comm, "--min-age", "0s", "--reconcile-apply", "--container", victim)
		w.waitReady(t, "docker")
		w.waitLine(t, map[string]any{"msg": "following container deaths", "engine": "containerd"})

		dt.Must(t, "kill", victim)
		waitAllDead(t, tree, 20*time.Second)
		w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
		// docker's die, containerd's /tasks/exit and /tasks/delete: the
		// two that came second and third are coalesced.
		coalesced := map[string]any{"msg": "container death already being handled or just handled; coalesced", "container": victim}
		proc.WaitFor(t, 20*time.Second, "the repeats coalesced", func() bool { return len(w.lines(coalesced)) >= 2 })
		handled := w.lines(map[string]any{"msg": "container death handled", "container": victim})
		if len(handled) != 1 || handled[0]["reaped"] != float64(1) {
			t.Errorf("death handled %d times (%v), want once, reaping the tree", len(handled), handled)
		}
	})

	t.Run("dry run logs would-reap and no-events waits for the round", func(t *testing.T) {
		victim := dt.Run(t, nil)
		_, tree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
		dry := startWatch(t, append(engine, "--container", victim)...)
		noEvents := startWatch(t, append(engine, "--reconcile-apply", "--no-events", "--no-pidfd", "--container", victim)...)
		dry.waitReady(t, "docker")
		noEvents.waitLine(t, map[string]any{"msg": "reconcile", "step": "reconcile"})

		dt.Must(t, "kill", victim)
		// The dry run's handling is the barrier: by then the apply watch
		// would have had the same event.
		l := dry.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
		if l["would_reap"] != float64(1) || l["reaped"] != float64(0) || l["dry_run"] != true {
			t.Errorf("dry-run death line %v, want one would-reap", l)
		}
		if len(dry.lines(map[string]any{"msg": "[DRY-RUN] would reap stray tree", "container": victim})) != 1 {
			t.Error("the dry run did not log the would-reap tree")
		}
		if len(aliveOf(tree)) != len(tree) {
			t.Fatal("a tree was reaped without --reconcile-apply, or by a watch with --no-events --no-pidfd")
		}
		if n := len(noEvents.lines(map[string]any{"msg": "following container deaths"})); n != 0 {
			t.Errorf("--no-events followed deaths (%d lines)", n)
		}
	})
}

// TestWatchContainerdDeathEvents: the same for a containerd task killed
// and deleted with ctr (the container itself is not removed): its
// /tasks/exit and /tasks/delete alone get the tree reaped, another
// container's tree is not touched. A killed task that is not deleted keeps
// its shim, which DESIGN "Ground truth must be corroborated" takes as the container still running.
func TestWatchContainerdDeathEvents(t *testing.T) {
	addr := containerdtest.Address(t)
	const ns, comm = "kc-e2e-w", "kcsrv-e2e-wcd"
	live, victim := hexID(t), hexID(t)
	containerdtest.Run(t, addr, ns, live, nil, "/bin/sleep", "600")
	containerdtest.Run(t, addr, ns, victim, nil, "/bin/sleep", "600")
	_, liveTree := startTree(t, t.TempDir(), live, testutil.Fake{Comm: comm})
	_, victimTree := startTree(t, t.TempDir(), victim, testutil.Fake{Comm: comm})
	w := startWatch(t, "--engine", "containerd", "--containerd-address", addr, "--supervisor-comm", comm, "--min-age", "0s",
		"--reconcile-apply", "--container", live, "--container", victim)
	w.waitReady(t, "containerd")

	containerdtest.Kill(t, addr, ns, victim)
	containerdtest.Ctr(t, addr, ns, "tasks", "rm", victim)
	waitAllDead(t, victimTree, 20*time.Second)
	l := w.waitLine(t, map[string]any{"msg": "container death handled", "container": victim})
	t.Logf("death line: %v", l)
	if l["reaped"] != float64(1) || l["engine"] != "containerd" {
		t.Errorf("death line %v, want one tree reaped, reported by containerd", l)
	}
	if len(aliveOf(liveTree)) != len(liveTree) {
		t.Fatal("the live container's tree lost a member when another container died")
	}
	if n := len(w.lines(map[string]any{"msg": "reconcile", "step": "reconcile"})); n != 1 {
		t.Errorf("%d rounds ran, want only the first", n)
	}
}
