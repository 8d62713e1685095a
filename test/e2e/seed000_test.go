package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// sweepReport is sweep's JSON, the fields the tests read.
type sweepReport struct {
	DryRun  bool `json:"dry_run"`
	Sockets []struct {
		Path    string `json:"path"`
		PID     int    `json:"pid"`
		Kind    string `json:"kind"`
		Verdict string `json:"verdict"`
		Reason  string `json:"reason"`
		Action  string `json:"action"`
	} `json:"sockets"`
}

// cullReport is cull's JSON, the fields the tests read.
type cullReport struct {
	Supervisors []struct {
		Socket     string  `json:"socket"`
		PID        int     `json:"pid"`
		Error      *string `json:"error"`
		Candidates []struct {
			SessionID   string `json:"session_id"`
			Status      string `json:"status"`
			Connected   bool   `json:"connected"`
			IdleSeconds int64  `json:"idle_seconds"`
		} `json:"candidates"`
	} `json:"supervisors"`
}

// TestSeed000Docker is the scenario the seed scripts (000_…) were written
// for, on a real Docker Engine: kcserver runs inside a container named
// positron-server-…, with its sockets in the container's /tmp and nothing
// of ours inside. Two supervisors run; one is SIGKILLed inside the
// container. `KC_CONTAINER=<name> kc-janitor sweep` must call exactly the
// dead one's sockets stale and the live one's live, KC_SWEEP=1 must unlink
// only the stale ones, and `cull --container <12-char ID prefix>` must
// find the live supervisor's idle, disconnected session. In the second
// variant the dead supervisor's PID is taken, in the container's PID
// namespace, by a thread of another kcserver process (posit-dev/positron
// #16167 inside a container): kill(pid, 0) answers, and the sockets must
// still be stale. In the third the supervisors run as uid 1000, started
// by docker exec under tini, as Positron's server starts them. Once the
// container is stopped, sweep refuses it (exit 1).
func TestSeed000Docker(t *testing.T) {
	d := dockertest.Need(t)
	kcserver := testutil.BuildKCServer(t)
	tests := []struct {
		name   string
		thread bool
		// exec: the supervisors are started by `docker exec -u 1000`, as
		// Positron's server launches them as its user, under tini
		// (--init), instead of by the container's command as root.
		exec bool
	}{
		{"supervisor SIGKILLed", false, false},
		{"its PID now a thread of another kcserver", true, false},
		{"started by docker exec as uid 1000", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "positron-server-" + testutil.RandomHex(t, 12)
			opts := []string{"--name", name, "-v", kcserver + ":/kcserver:ro", "-e", "KCFAKE_OPEN_CHANNELS=1"}
			if tt.thread {
				// ns_last_pid must be writable inside the container
				// (--privileged also wants capabilities these hosts'
				// own containers may lack).
				opts = append(opts, "--cap-add", "SYS_ADMIN", "--security-opt", "systempaths=unconfined")
			}
			var id string
			if tt.exec {
				id = d.Run(t, append(opts, "--init"), "/bin/sh", "-c", "chmod 1777 /tmp && exec sleep 100000")
				proc.WaitFor(t, 10*time.Second, "/tmp writable by all", func() bool {
					st, err := os.Stat(fmt.Sprintf("/proc/%d/root/tmp", d.InitPID(t, id)))
					return err == nil && st.Mode()&os.ModeSticky != 0
				})
				for _, x := range []string{"a", "b"} {
					d.Must(t, "exec", "-d", "-u", "1000:1000", "-e", "KCFAKE_OPEN_CHANNELS=1", "-e", "KCFAKE_READY_FILE=/tmp/ready-"+x,
						name, "/kcserver", "--transport=socket", "--socket-dir=/tmp")
				}
			} else {
				// sh stays PID 1 and reaps (wait), so the dead supervisor's
				// PID is free again, as under Positron's own init.
				id = d.Run(t, opts, "/bin/sh", "-c",
					"KCFAKE_READY_FILE=/tmp/ready-a /kcserver --transport=socket --socket-dir=/tmp & "+
						"KCFAKE_READY_FILE=/tmp/ready-b /kcserver --transport=socket --socket-dir=/tmp & wait")
			}
			root := fmt.Sprintf("/proc/%d/root", d.InitPID(t, id))
			dead, live := readyPID(t, root+"/tmp/ready-a"), readyPID(t, root+"/tmp/ready-b")
			sock := func(pid int, session bool) string {
				if session {
					return fmt.Sprintf("%s/tmp/kc-%d.python-0.sock", root, pid)
				}
				return fmt.Sprintf("%s/tmp/kc-%d.sock", root, pid)
			}

			if st, err := os.Lstat(sock(dead, false)); err != nil {
				t.Fatal(err)
			} else if uid := st.Sys().(*syscall.Stat_t).Uid; tt.exec != (uid == 1000) {
				t.Fatalf("%s is owned by uid %d", sock(dead, false), uid)
			}
			d.Must(t, "exec", name, "/bin/kill", "-KILL", strconv.Itoa(dead))
			proc.WaitFor(t, 10*time.Second, "the killed supervisor reaped in the container", func() bool {
				_, err := os.Stat(fmt.Sprintf("%s/proc/%d", root, dead))
				return os.IsNotExist(err)
			})
			if tt.thread {
				threadAtInContainer(t, d, name, root, dead)
			}

			env := dockerOnlyEnv(d, "KC_CONTAINER="+name)
			want := map[string]string{
				sock(dead, false): "stale", sock(dead, true): "stale",
				sock(live, false): "live", sock(live, true): "live",
			}
			rep := sweepJSON(t, env, "sweep", "--format", "json", "--timeout", "500ms")
			if !rep.DryRun || len(rep.Sockets) != len(want) {
				t.Errorf("dry run %v, %d sockets, want %d: %+v", rep.DryRun, len(rep.Sockets), len(want), rep.Sockets)
			}
			for _, s := range rep.Sockets {
				if w := want[s.Path]; s.Verdict != w {
					t.Errorf("%s: %s (%s), want %q", s.Path, s.Verdict, s.Reason, w)
				}
			}
			if tt.thread {
				assertThread(t, root, dead)
			}

			rep = sweepJSON(t, append(env, "KC_SWEEP=1"), "sweep", "--format", "json", "--timeout", "500ms")
			if rep.DryRun {
				t.Error("KC_SWEEP=1 ran a dry run")
			}
			for p, w := range want {
				_, err := os.Lstat(p)
				switch {
				case w == "stale" && err == nil:
					t.Errorf("stale %s was not unlinked", p)
				case w == "live" && err != nil:
					t.Errorf("live %s: %v", p, err)
				}
			}
			if tt.thread {
				assertThread(t, root, dead)
			}

			out, errOut, code := janitor(t, dockerOnlyEnv(d), "cull", "--container", id[:12], "--format", "json")
			var cr cullReport
			if err := json.Unmarshal([]byte(out), &cr); err != nil || code != 0 {
				t.Fatalf("cull exit %d: %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
			}
			if len(cr.Supervisors) != 1 || cr.Supervisors[0].Socket != sock(live, false) || cr.Supervisors[0].Error != nil {
				t.Fatalf("cull audited %+v, want only %s", cr.Supervisors, sock(live, false))
			}
			if c := cr.Supervisors[0].Candidates; len(c) != 1 || c[0].Connected || c[0].Status != "idle" || c[0].IdleSeconds < 86400 {
				t.Errorf("candidates %+v, want the one idle, disconnected session", c)
			}

			// A stopped container has no init whose root reaches its
			// sockets: sweep refuses it rather than look anywhere else.
			d.Must(t, "kill", name)
			waitDockerState(t, d, id, "exited")
			out, errOut, code = janitor(t, append(env, "KC_SWEEP=1"), "sweep")
			if code != 1 || out != "" || !strings.Contains(errOut, "is not running") || strings.Count(errOut, "\n") != 1 {
				t.Errorf("sweep of a stopped container: exit %d, want 1 and one line saying it is not running\nstdout: %s\nstderr: %s", code, out, errOut)
			}
		})
	}
}

// dockerOnlyEnv is the test's environment as a Docker-only host would
// have it: no other engine's endpoint, the private dockerd, plus extra.
func dockerOnlyEnv(d *dockertest.Docker, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KC_") || k == "DOCKER_HOST" || k == "CONTAINER_HOST" || k == "CONTAINERD_ADDRESS" {
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, "KC_ENGINE=docker", "KC_DOCKER_URL="+d.URL), extra...)
}

// sweepJSON runs a sweep that must succeed and decodes its report.
func sweepJSON(t *testing.T, env []string, args ...string) sweepReport {
	t.Helper()
	out, errOut, code := janitor(t, env, args...)
	var rep sweepReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("sweep exit %d: %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	return rep
}

// threadAtInContainer makes pid, in the container's PID namespace, a
// thread of another process: inside the container, ns_last_pid is set
// just below it and a kcserver (TCP, so it makes no socket) is exec'd by
// the shell that set it; the Go runtime's first new thread takes pid.
func threadAtInContainer(t *testing.T, d *dockertest.Docker, name, root string, pid int) {
	t.Helper()
	d.Must(t, "exec", "-d", name, "/bin/sh", "-c",
		fmt.Sprintf("echo %d > /proc/sys/kernel/ns_last_pid && exec /kcserver --transport tcp", pid-1))
	proc.WaitFor(t, 10*time.Second, fmt.Sprintf("pid %d taken in the container", pid), func() bool {
		_, err := os.Stat(fmt.Sprintf("%s/proc/%d/status", root, pid))
		return err == nil
	})
	assertThread(t, root, pid)
}

// assertThread fails unless pid, in the container's PID namespace, is a
// live thread of another process, named kcserver.
func assertThread(t *testing.T, root string, pid int) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("%s/proc/%d/status", root, pid))
	if err != nil {
		t.Fatalf("the thread at %d: %v", pid, err)
	}
	f := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f[k] = strings.TrimSpace(v)
	}
	if f["Tgid"] == strconv.Itoa(pid) || f["Name"] != "kcserver" || strings.HasPrefix(f["State"], "Z") {
		t.Fatalf("pid %d in the container is not a live kcserver thread of another process: Name %q Tgid %q State %q",
			pid, f["Name"], f["Tgid"], f["State"])
	}
}

// readyPID waits for a fake kcserver's ready file and returns the PID it
// wrote (its PID in its own PID namespace).
func readyPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	proc.WaitFor(t, 30*time.Second, path, func() bool {
		data, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		first, _, _ := strings.Cut(string(data), "\n")
		pid, err = strconv.Atoi(first)
		return err == nil
	})
	return pid
}
