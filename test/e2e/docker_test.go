package e2e

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestReconcileDocker: dockerd is the ground truth. Host-side trees of a
// running, a paused and a restarting container are skipped-live; once a
// container is removed (docker rm -f, no hook on Docker hosts) its tree
// is reaped by --apply; a dockerd that cannot be asked — socket absent,
// accepting and never answering, answering garbage — makes the truth
// unknown: exit 3, one line naming the endpoint, the stray tree alive.
func TestReconcileDocker(t *testing.T) {
	d := dockertest.Need(t)
	name := "kc-e2e-run-" + strconv.Itoa(os.Getpid())
	running := d.Run(t, []string{"--name", name})
	paused := d.Run(t, nil)
	d.Must(t, "pause", paused)
	restarting := d.Run(t, []string{"--restart", "always"}, "/bin/sh", "-c", "exit 1")
	gone := d.Run(t, nil)

	// A supervisor name of this test's own, and --container scoping: other
	// packages' fake trees are never this test's to reap.
	const comm = "kcsrv-e2e-dock"
	trees := map[string][]fingerprint.Stat{}
	for _, id := range []string{running, paused, restarting, gone} {
		_, trees[id] = startTree(t, t.TempDir(), id, testutil.Fake{Comm: comm})
	}
	// The running container by name: resolved by dockerd; the others by
	// full ID, taken as is.
	scope := []string{"--container", name, "--container", paused, "--container", restarting, "--container", gone}
	base := append([]string{"--engine", "docker", "--docker-url", d.URL, "--format", "json", "--state-dir", t.TempDir(),
		"--kill-grace", "500ms", "--supervisor-comm", comm, "--min-age", "0s", "--podman-timeout", "2s"}, scope...)
	run := func(t *testing.T, extra ...string) (reconcileReport, string, int) {
		t.Helper()
		out, errOut, code := janitor(t, nil, append(append([]string{"reconcile"}, base...), extra...)...)
		var rep reconcileReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("reconcile printed no JSON (exit %d): %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
		}
		return rep, errOut, code
	}
	intact := func(t *testing.T, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if n := len(aliveOf(trees[id])); n != len(trees[id]) {
				t.Errorf("tree of %.12s lost %d of %d members", id, len(trees[id])-n, len(trees[id]))
			}
		}
	}

	t.Run("running, paused and restarting containers are live", func(t *testing.T) {
		// "restarting" lasts the restart back-off (doubling from 100 ms);
		// RestartCount unchanged around the run proves dockerd said
		// "restarting", not "running", when it was asked. The janitor is
		// built first, so that the build does not widen the window.
		bin(t, "kc-janitor")
		for attempt := 0; ; attempt++ {
			before := waitDockerState(t, d, restarting, "restarting")
			rep, errOut, code := run(t, "--apply")
			after := d.Must(t, "inspect", "--format", "{{.State.Status}} {{.RestartCount}}", restarting)
			if code != 0 || !rep.LivenessKnown {
				t.Fatalf("exit %d, liveness known %v: %s", code, rep.LivenessKnown, errOut)
			}
			for _, id := range []string{running, paused, restarting, gone} {
				if got := rep.action(trees[id][0].PGID); got != "skipped-live" {
					t.Errorf("tree of %.12s: %q, want skipped-live", id, got)
				}
			}
			if after == before {
				t.Logf("restarting container: %s around the run (attempt %d)", after, attempt)
				break
			}
			if attempt == 5 {
				t.Fatalf("the restarting container never stayed restarting for one run: %q then %q", before, after)
			}
		}
		if st := d.Must(t, "inspect", "--format", "{{.State.Status}}", paused); st != "paused" {
			t.Fatalf("paused container is %q", st)
		}
		intact(t, running, paused, restarting, gone)
	})

	d.Must(t, "rm", "-f", gone)
	// Until its containerd-shim has exited, the removed container still
	// runs as far as DESIGN "Ground truth must be corroborated" is concerned (skipped-contradicted).
	proc.WaitFor(t, 30*time.Second, "the removed container's containerd-shim gone", func() bool { return !shimRuns(gone) })

	t.Run("dockerd that cannot be asked touches nothing", func(t *testing.T) {
		dir := t.TempDir()
		tests := []struct {
			name  string
			serve func(net.Conn) // nil: nothing listens on the path
			says  string         // what the line must say besides the socket
		}{
			{"absent socket", nil, "no such file"},
			{"hung: accepts, never answers", func(c net.Conn) { io.Copy(io.Discard, c) }, "no answer within 1s"},
			{"garbage: 200 with a body that is not JSON", func(c net.Conn) {
				c.Read(make([]byte, 4096))
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n<html>no</ht")
				io.Copy(io.Discard, c)
			}, "not the JSON Docker sends"},
			{"garbage: not HTTP", func(c net.Conn) {
				c.Read(make([]byte, 4096))
				io.WriteString(c, "\x00\x01garbage\r\n\r\n")
				c.Close()
			}, "malformed HTTP response"},
			{"garbage: a list with no IDs", func(c net.Conn) {
				c.Read(make([]byte, 4096))
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n[{\"State\":\"exited\"}]")
				io.Copy(io.Discard, c)
			}, "no full container ID"},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				sock := filepath.Join(dir, strconv.Itoa(i)+".sock")
				if tt.serve != nil {
					fakeAPI(t, sock, tt.serve)
				}
				start := time.Now()
				out, errOut, code := janitor(t, nil, "reconcile", "--engine", "docker", "--docker-url", "unix://"+sock,
					"--podman-timeout", "1s", "--state-dir", t.TempDir(), "--kill-grace", "500ms",
					"--supervisor-comm", comm, "--min-age", "0s", "--apply", "--container", gone)
				took := time.Since(start)
				t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.SplitN(out, "\n", 2)[0])
				if code != 3 {
					t.Fatalf("exit %d, want 3\nstdout: %s\nstderr: %s", code, out, errOut)
				}
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 2 || !strings.Contains(lines[0], sock) || !strings.Contains(lines[0], "docker") ||
					!strings.Contains(lines[0], tt.says) || lines[1] != "nothing was touched." {
					t.Errorf("want one line naming docker and %s, saying %q, then \"nothing was touched.\":\n%s", sock, tt.says, out)
				}
				if took > 10*time.Second {
					t.Errorf("took %v with a 1s engine timeout", took)
				}
				intact(t, gone)
			})
		}
	})

	t.Run("dry run, then apply reaps the removed container's tree", func(t *testing.T) {
		rep, errOut, code := run(t)
		if code != 0 || rep.action(trees[gone][0].PGID) != "would-reap" || rep.action(trees[running][0].PGID) != "skipped-live" {
			t.Fatalf("dry run: exit %d, stray %q, live %q: %s", code, rep.action(trees[gone][0].PGID), rep.action(trees[running][0].PGID), errOut)
		}
		intact(t, gone)
		rep, errOut, code = run(t, "--apply")
		if code != 0 || rep.action(trees[gone][0].PGID) != "reaped" {
			t.Fatalf("apply: exit %d, stray %q: %s", code, rep.action(trees[gone][0].PGID), errOut)
		}
		waitAllDead(t, trees[gone], 10*time.Second)
		intact(t, running, paused, restarting)
	})
}

// waitDockerState polls until container id is in state and returns
// "<state> <RestartCount>".
func waitDockerState(t *testing.T, d *dockertest.Docker, id, state string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := d.Must(t, "inspect", "--format", "{{.State.Status}} {{.RestartCount}}", id)
		if strings.HasPrefix(s, state+" ") {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s is %q, never %s", id, s, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fakeAPI listens on sock and hands each connection to serve until the
// test ends: a stand-in for a dockerd that is hung or answers garbage.
func fakeAPI(t *testing.T, sock string, serve func(net.Conn)) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); serve(c) }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// shimRuns reports whether a containerd-shim process carrying id in its
// argv runs on this host.
func shimRuns(id string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(argv), "containerd-shim") && strings.Contains(string(argv), id) {
			return true
		}
	}
	return false
}
