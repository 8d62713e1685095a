package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// TestSweepAndCullInRealContainer runs the fake supervisor inside a real
// podman container and audits it from the host with --container NAME
// (podman inspect for the init PID, /proc/<init>/root for the files, the
// container's PID namespace for the owners).
func TestSweepAndCullInRealContainer(t *testing.T) {
	e := podmantest.New(t)
	for _, kv := range e.EnvVars() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, k := range []string{"CONTAINER_HOST", "KC_PODMAN_URL"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	bin := testutil.BuildKCServer(t)
	name := "kcsweep-" + strconv.Itoa(os.Getpid())
	id := e.Run(t, "--name", name, "-v", bin+":/kcserver:ro", "-e", "KCFAKE_READY_FILE=/tmp/ready", "-e", "KCFAKE_OPEN_CHANNELS=1", "--",
		"/bin/sh", "-c", "/kcserver --transport=socket --socket-dir=/tmp & exec /bin/sleep 100000")
	t.Cleanup(func() { e.Remove(t, id) })
	initPID := e.InitPID(t, id)
	root := fmt.Sprintf("/proc/%d/root", initPID)

	deadline := time.Now().Add(30 * time.Second)
	var inner string
	for {
		if data, err := os.ReadFile(root + "/tmp/ready"); err == nil && strings.TrimSpace(string(data)) != "" {
			inner, _, _ = strings.Cut(string(data), "\n")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fake kcserver in the container never got ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	control := root + "/tmp/kc-" + inner + ".sock"
	session := root + "/tmp/kc-" + inner + ".python-0.sock"
	// An orphan inside the container, named after a PID nothing there has.
	orphan := orphanSock(t, root+"/tmp", "kc-31999.sock")

	code, out := runJanitorCapture(t, podmanArgs(e, "sweep", "--container", name, "--socket-dir", "/tmp", "--format", "json", "--timeout", "500ms")...)
	if code != exitOK {
		t.Fatalf("sweep exit %d\n%s", code, out)
	}
	got := decodeSweep(t, out)
	for p, want := range map[string]string{control: "live", session: "live", orphan: "stale"} {
		if s := got[p]; s == nil || s["verdict"] != want {
			t.Errorf("%s: %v, want %s", p, s, want)
		}
	}

	// cull audits the supervisors its own sweep finds live; on a loaded
	// machine that probe can come back unknown (the supervisor is then
	// not audited, exit 0), so a run that finds none is taken again.
	for try := 1; ; try++ {
		code, out = runJanitorCapture(t, podmanArgs(e, "cull", "--container", name, "--socket-dir", "/tmp", "--format", "json", "--log-level", "info")...)
		if code != exitOK {
			t.Fatalf("cull exit %d\n%s", code, out)
		}
		var cr cullOut
		if err := json.Unmarshal([]byte(out), &cr); err != nil {
			t.Fatal(err)
		}
		if len(cr.Supervisors) == 0 && try < 3 {
			t.Logf("cull found no live supervisor (try %d): %s", try, out)
			continue
		}
		if len(cr.Supervisors) != 1 || cr.Supervisors[0].Socket != control || len(cr.Supervisors[0].Candidates) != 1 {
			t.Errorf("cull: %s", out)
		}
		break
	}

	// SIGKILL the supervisor (found as the init's kcserver child on the
	// host): its sockets are stale and --apply removes them.
	kc := 0
	ents, _ := os.ReadDir("/proc")
	for _, en := range ents {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid); err == nil && st.PPID == initPID && st.Comm == "kcserver" {
			kc = pid
		}
	}
	if kc == 0 {
		t.Fatal("kcserver not found on the host")
	}
	syscall.Kill(kc, syscall.SIGKILL)
	for {
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, kc)
		if err != nil || st.Zombie() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kcserver survived SIGKILL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, out = runJanitorCapture(t, podmanArgs(e, "sweep", "--container", name, "--socket-dir", "/tmp", "--format", "json", "--apply", "--timeout", "500ms")...)
	if code != exitOK {
		t.Fatalf("sweep --apply exit %d\n%s", code, out)
	}
	got = decodeSweep(t, out)
	for _, p := range []string{control, session, orphan} {
		if s := got[p]; s == nil || s["action"] != "unlinked" {
			t.Errorf("%s: %v", p, s)
		}
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s still exists", filepath.Base(p))
		}
	}
}

// TestSweepLearnsContainerDirs: without --socket-dir, sweep looks where
// the container's supervisors put their sockets: a --socket-dir read from
// a live kcserver's argv and the XDG_RUNTIME_DIR of its environment; in a
// container with no live kcserver, the directories its init's environment
// names. The JSON says where each directory came from.
func TestSweepLearnsContainerDirs(t *testing.T) {
	e := podmantest.New(t)
	for _, kv := range e.EnvVars() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, k := range []string{"CONTAINER_HOST", "KC_PODMAN_URL", "KC_SOCKET_DIR"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	bin := testutil.BuildKCServer(t)
	withKC := "kcdirs-kc-" + strconv.Itoa(os.Getpid())
	id := e.Run(t, "--name", withKC, "-v", bin+":/kcserver:ro", "-e", "XDG_RUNTIME_DIR=/run/xdg", "-e", "KCFAKE_READY_FILE=/srv/ready", "--",
		"/bin/sh", "-c", "mkdir -p /run/xdg /srv/kcs && /kcserver --transport socket --socket-dir /srv/kcs & exec /bin/sleep 100000")
	t.Cleanup(func() { e.Remove(t, id) })
	bare := "kcdirs-bare-" + strconv.Itoa(os.Getpid())
	id2 := e.Run(t, "--name", bare, "-e", "XDG_RUNTIME_DIR=/run/xdg", "--",
		"/bin/sh", "-c", "mkdir -p /run/xdg && exec /bin/sleep 100000")
	t.Cleanup(func() { e.Remove(t, id2) })

	root := fmt.Sprintf("/proc/%d/root", e.InitPID(t, id))
	deadline := time.Now().Add(30 * time.Second)
	var inner string
	for {
		if data, err := os.ReadFile(root + "/srv/ready"); err == nil {
			inner, _, _ = strings.Cut(string(data), "\n")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fake kcserver in the container never got ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	control := root + "/srv/kcs/kc-" + inner + ".sock"
	argvOrphan := orphanSock(t, root+"/srv/kcs", "kc-31999.sock")
	xdgOrphan := orphanSock(t, root+"/run/xdg", "kc-31998.sock")

	bareRoot := fmt.Sprintf("/proc/%d/root", e.InitPID(t, id2))
	for !testutil.PathExists(bareRoot + "/run/xdg") {
		if time.Now().After(deadline) {
			t.Fatal("/run/xdg never appeared in the bare container")
		}
		time.Sleep(20 * time.Millisecond)
	}
	initOrphan := orphanSock(t, bareRoot+"/run/xdg", "kc-31997.sock")

	tests := []struct {
		container string
		want      map[string]string // path → verdict
		dirs      map[string]string // dir → a source it must name
	}{
		{withKC, map[string]string{control: "live", argvOrphan: "stale", xdgOrphan: "stale"},
			map[string]string{"/srv/kcs": "--socket-dir", "/run/xdg": "XDG_RUNTIME_DIR", "/tmp": "default"}},
		{bare, map[string]string{initOrphan: "stale"},
			map[string]string{"/run/xdg": "container init"}},
	}
	for _, tt := range tests {
		t.Run(tt.container, func(t *testing.T) {
			code, out := runJanitorCapture(t, podmanArgs(e, "sweep", "--container", tt.container, "--format", "json", "--timeout", "500ms")...)
			if code != exitOK {
				t.Fatalf("sweep exit %d\n%s", code, out)
			}
			got := decodeSweep(t, out)
			for p, want := range tt.want {
				if s := got[p]; s == nil || s["verdict"] != want {
					t.Errorf("%s: %v, want %s\n%s", p, s, want, out)
				}
			}
			var rep struct {
				Dirs []struct {
					Path    string   `json:"path"`
					Sources []string `json:"sources"`
				} `json:"dirs"`
			}
			json.Unmarshal([]byte(out), &rep)
			for dir, src := range tt.dirs {
				ok := false
				for _, d := range rep.Dirs {
					ok = ok || d.Path == dir && strings.Contains(strings.Join(d.Sources, ";"), src)
				}
				if !ok {
					t.Errorf("dirs lack %s from %q: %+v", dir, src, rep.Dirs)
				}
			}
		})
	}
}

// podmanArgs puts --podman-arg flags naming the test's private store after
// the command: a podman API service on this host may serve another store,
// and the engine must be told which one holds the test's containers.
func podmanArgs(e *podmantest.Env, cmd string, args ...string) []string {
	out := []string{cmd}
	for _, a := range e.GlobalArgs() {
		out = append(out, "--podman-arg="+a)
	}
	return append(out, args...)
}
