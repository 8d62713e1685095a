package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/doctor"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestDoctorEngines: one check per engine against the private dockerd and
// containerd, each running a container of this test's; the engines line
// says what auto found; a named engine whose socket is absent is an ERROR
// with its remedy (exit 2), one auto found is a warning.
func TestDoctorEngines(t *testing.T) {
	dk := dockertest.Need(t)
	cdAddr := containerdtest.Address(t)
	dk.Run(t, nil)
	// A namespace of this run's own (the containerd case counts its
	// containers exactly), removed with its image when the test ends.
	ns := "kc-doctor-" + testutil.RandomHex(t, 8)
	t.Cleanup(func() { removeNamespace(cdAddr, ns) })
	containerdtest.Run(t, cdAddr, ns, testutil.RandomHex(t, 64), nil, "/bin/sleep", "100000")
	absent := filepath.Join(t.TempDir(), "absent.sock")
	euid := os.Geteuid()

	type want struct {
		verdict doctor.Verdict
		detail  []string
	}
	for _, tc := range []struct {
		name   string
		args   []string
		failed bool // exit 2
		checks map[string]want
		// live is each engine's live count the JSON must report (-1:
		// at least one, since other tests share the dockerd).
		live map[string]int
	}{
		{"docker named", []string{"--engine", "docker", "--docker-url", dk.URL}, false, map[string]want{
			doctor.NameEngines: {doctor.OK, []string{"named by --engine: docker (" + dk.URL + ")"}},
			doctor.NameDocker:  {doctor.OK, []string{"api " + dk.URL + ": version 20.", "(API 1.", " live, uid " + strconv.Itoa(euid) + " ("}},
		}, map[string]int{"docker": -1}},
		{"containerd named", []string{"--engine", "containerd", "--containerd-address", cdAddr, "--containerd-namespace", ns}, false, map[string]want{
			doctor.NameContainerd: {doctor.OK, []string{"api " + cdAddr + ": version 1.", "1 container, 1 live, uid " + strconv.Itoa(euid)}},
		}, map[string]int{"containerd": 1}},
		{"auto finds all three and podman is down", []string{"--docker-url", dk.URL, "--containerd-address", cdAddr, "--containerd-namespace", ns}, false, map[string]want{
			doctor.NameEngines:    {doctor.OK, []string{"auto found podman (unix:///nonexistent/podman.sock), docker (" + dk.URL + "), containerd (" + cdAddr + ")"}},
			doctor.NamePodman:     {doctor.Warn, []string{"unreachable", "auto found its endpoint", "remedy: start podman's API service"}},
			doctor.NameDocker:     {doctor.OK, []string{"version 20."}},
			doctor.NameContainerd: {doctor.OK, []string{"1 live"}},
		}, map[string]int{"docker": -1, "containerd": 1}},
		{"docker named and its socket absent", []string{"--engine", "docker", "--docker-url", "unix://" + absent}, true, map[string]want{
			doctor.NameDocker: {doctor.Error, []string{"unreachable", "--engine names it", absent, "remedy: start dockerd or point --docker-url"}},
		}, nil},
		{"containerd named and its socket absent", []string{"--engine", "containerd", "--containerd-address", absent}, true, map[string]want{
			doctor.NameContainerd: {doctor.Error, []string{"unreachable", absent, "remedy: start containerd"}},
			doctor.NameStrays:     {doctor.Warn, []string{"not checked: ground truth unknown"}},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newDoctorHost(t)
			code, out := runJanitorCapture(t, h.args(append(tc.args, "--format", "json")...)...)
			rep := decodeDoctor(t, out)
			if failed := code == 2 && rep.Worst == doctor.Error; failed != tc.failed {
				t.Errorf("exit %d, worst %v; want failed=%v\n%s", code, rep.Worst, tc.failed, out)
			}
			// An engine --engine leaves out has no check.
			if tc.args[0] == "--engine" {
				for _, c := range rep.Checks {
					if e := c.Name; (e == doctor.NamePodman || e == doctor.NameDocker || e == doctor.NameContainerd) && !strings.Contains(tc.args[1], e) {
						t.Errorf("a check for %s, which --engine %s leaves out: %+v", e, tc.args[1], c)
					}
				}
			}
			for name, w := range tc.checks {
				c := checkOf(t, rep, name)
				if c.Verdict != w.verdict {
					t.Errorf("%s: %v (%s), want %v", name, c.Verdict, c.Detail, w.verdict)
				}
				for _, s := range w.detail {
					if !strings.Contains(c.Text(), s) {
						t.Errorf("%s: detail %q lacks %q", name, c.Text(), s)
					}
				}
			}
			if len(rep.Engines) != 4 {
				t.Fatalf("engines %+v, want podman, docker, containerd, cri", rep.Engines)
			}
			for _, r := range rep.Engines {
				n, asked := tc.live[r.Name]
				switch {
				case asked && (!r.Reachable || r.UID != euid || r.Version == "" || r.Error != nil):
					t.Errorf("%s: %+v, want reachable, uid %d, a version", r.Name, r, euid)
				case asked && (n >= 0 && r.Live != n || n < 0 && r.Live < 1 || r.Containers < r.Live):
					t.Errorf("%s: %d containers, %d live; want %d live", r.Name, r.Containers, r.Live, n)
				case !asked && r.Reachable:
					t.Errorf("%s: reachable, want not asked or failed: %+v", r.Name, r)
				}
			}
		})
	}
}

// removeNamespace deletes a containerd namespace and its images, waiting
// for containerd's background collection of their blobs and snapshots.
func removeNamespace(addr, ns string) {
	if out, err := containerdtest.TryCtr(addr, ns, nil, "images", "ls", "-q"); err == nil {
		for _, img := range strings.Fields(out) {
			containerdtest.TryCtr(addr, ns, nil, "images", "rm", img)
		}
	}
	for range 300 {
		if _, err := containerdtest.TryCtr(addr, ns, nil, "namespaces", "rm", ns); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDoctorHookOnDockerHost: a Docker host has no hooks.d for kc-hook, and
// doctor must not call that an error there; where podman is asked, the
// same empty hooks dir still is one.
func TestDoctorHookOnDockerHost(t *testing.T) {
	dk := dockertest.Need(t)
	for _, tc := range []struct {
		name string
		args []string
		want doctor.Verdict
	}{
		{"docker only", []string{"--engine", "docker", "--docker-url", dk.URL}, doctor.OK},
		{"docker and podman", []string{"--engine", "docker,podman", "--docker-url", dk.URL}, doctor.Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newDoctorHost(t)
			files, _ := filepath.Glob(filepath.Join(h.hooks, "*.json"))
			for _, f := range files {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
			_, out := runJanitorCapture(t, h.args(append(tc.args, "--format", "json")...)...)
			c := checkOf(t, decodeDoctor(t, out), doctor.NameHookInstalled)
			if c.Verdict != tc.want {
				t.Errorf("hook installed: %v (%s), want %v", c.Verdict, c.Detail, tc.want)
			}
		})
	}
}
