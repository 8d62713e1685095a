package cri

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	_ "github.com/kc-watchman/kc-watchman/internal/engine/cri" // registers --engine cri
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// hooklessSpec is the shipped base spec without kc-hook: here the janitor
// alone judges the trees, through the cri engine.
func hooklessSpec(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../contrib/containerd/base-runtime-spec.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	delete(spec, "hooks")
	out, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "base-spec.json")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runPodContainer starts a host-network pod and one container in it
// through CRI, and returns the container's ID.
func runPodContainer(ctx context.Context, t *testing.T, rs runtimeapi.RuntimeServiceClient, name string) string {
	t.Helper()
	return runPodContainerWith(ctx, t, rs, name, "")
}

// runPodContainerWith is runPodContainer with a runtime handler ("" is
// the default one).
func runPodContainerWith(ctx context.Context, t *testing.T, rs runtimeapi.RuntimeServiceClient, name, handler string) string {
	t.Helper()
	podCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "kc-ns"},
		LogDirectory: t.TempDir(),
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
		}},
	}
	pod, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rs.StopPodSandbox(c, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId})
		rs.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId})
	})
	cr, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  pod.PodSandboxId,
		SandboxConfig: podCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			Image:    &runtimeapi.ImageSpec{Image: containerdtest.ImageName},
			Command:  []string{"/bin/sleep", "600"},
			LogPath:  "app.log",
			// What the kubelet sets, and what names the pod in reports.
			Labels: map[string]string{"io.kubernetes.pod.namespace": "kc-ns", "io.kubernetes.pod.name": name, "io.kubernetes.container.name": "app"},
		},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return cr.ContainerId
}

type criReport struct {
	LivenessKnown bool `json:"liveness_known"`
	Engines       []struct {
		Name string `json:"name"`
		Live int    `json:"live"`
	} `json:"engines"`
	Trees []struct {
		PGID   int    `json:"pgid"`
		Pod    string `json:"pod"`
		Action string `json:"action"`
	} `json:"trees"`
}

func (r criReport) pod(pgid int) string {
	for _, t := range r.Trees {
		if t.PGID == pgid {
			return t.Pod
		}
	}
	return ""
}

func (r criReport) action(pgid int) string {
	for _, t := range r.Trees {
		if t.PGID == pgid {
			return t.Action
		}
	}
	return ""
}

// TestCRIEngine asks containerd's own CRI service as the ground truth
// (--engine cri): a running pod container is live and its tree kept; once
// stopped through CRI its tree is would-reap, then reaped with --apply; an
// unreachable endpoint is exit 3 with nothing touched. containerd 1.6 does
// not serve GetContainerEvents: that is "no events" (watch follows the
// pinned init), not a dropped stream. CRI-O's cgroup naming is covered by
// the evidence rules but not tested here: no CRI-O on these machines.
func TestCRIEngine(t *testing.T) {
	sock := criContainerd(t, hooklessSpec(t))
	containerdtest.ImportImage(t, sock, "k8s.io")
	rs := criClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	running := runPodContainer(ctx, t, rs, "kc-running")
	stopped := runPodContainer(ctx, t, rs, "kc-stopped")

	const comm = "kcsrv-cri"
	liveTree := startCRITree(t, running, comm)
	strayTree := startCRITree(t, stopped, comm)

	t.Run("engine API", func(t *testing.T) {
		es, err := engine.Select([]string{"cri"}, engine.Config{CRIEndpoint: sock})
		if err != nil {
			t.Fatal(err)
		}
		a, err := es[0].Live(ctx)
		if err != nil {
			t.Fatalf("Live: %v", err)
		}
		var found bool
		for _, c := range a.Containers {
			if c.ID != running {
				continue
			}
			found = true
			if !c.Live || c.Pod != "kc-ns/kc-running/app" || c.InitPID <= 0 {
				t.Fatalf("running container %+v: want live, pod kc-ns/kc-running/app, an init PID", c)
			}
			cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", c.InitPID))
			if err != nil || !strings.Contains(string(cg), running) {
				t.Fatalf("init PID %d is not in the container's cgroup: %s %v", c.InitPID, cg, err)
			}
		}
		if !found {
			t.Fatalf("running container %s not listed: %+v", running, a.Containers)
		}
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		defer dcancel()
		err = es[0].Deaths(dctx, engine.DeathWatch{Death: func(engine.Death) {}})
		if !errors.Is(err, engine.ErrNoEvents) {
			t.Fatalf("Deaths on containerd 1.6 = %v, want ErrNoEvents", err)
		}
	})

	if _, err := rs.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: stopped, Timeout: 2}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	janitor := testutil.Build(t, testutil.KCJanitorPackage, "kc-janitor")
	base := []string{"reconcile", "--engine", "cri", "--cri-endpoint", sock, "--format", "json", "--state-dir", t.TempDir(),
		"--kill-grace", "500ms", "--supervisor-comm", comm, "--min-age", "0s", "--container", running, "--container", stopped}
	run := func(t *testing.T, args ...string) (criReport, string, int) {
		t.Helper()
		cmd := exec.Command(janitor, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		code := 0
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatal(err)
			}
			code = ee.ExitCode()
		}
		var rep criReport
		json.Unmarshal(out.Bytes(), &rep) //nolint:errcheck // an exit-3 run prints no report
		return rep, errb.String(), code
	}

	t.Run("unreachable endpoint touches nothing", func(t *testing.T) {
		absent := filepath.Join(t.TempDir(), "absent.sock")
		_, errOut, code := run(t, "reconcile", "--engine", "cri", "--cri-endpoint", absent, "--state-dir", t.TempDir(),
			"--min-age", "0s", "--supervisor-comm", comm, "--apply", "--container", stopped)
		if code != 3 || !strings.Contains(errOut, "absent.sock") {
			t.Fatalf("exit %d, want 3 naming the socket: %s", code, errOut)
		}
		if alive(strayTree) != len(strayTree) {
			t.Fatal("the stray tree was touched while the CRI runtime could not be asked")
		}
	})

	t.Run("dry run, then apply", func(t *testing.T) {
		logFile := filepath.Join(t.TempDir(), "janitor.log")
		rep, errOut, code := run(t, base...)
		if code != 0 || !rep.LivenessKnown || rep.action(liveTree[0].PGID) != "skipped-live" || rep.action(strayTree[0].PGID) != "would-reap" {
			t.Fatalf("dry run: exit %d, live %q, stray %q: %s", code, rep.action(liveTree[0].PGID), rep.action(strayTree[0].PGID), errOut)
		}
		if got := rep.pod(liveTree[0].PGID); got != "kc-ns/kc-running/app" {
			t.Errorf("the running container's tree names pod %q, want kc-ns/kc-running/app", got)
		}
		if len(rep.Engines) != 1 || rep.Engines[0].Name != "cri" || rep.Engines[0].Live < 1 {
			t.Fatalf("engines %+v, want cri with the running container live", rep.Engines)
		}
		rep, errOut, code = run(t, append(base, "--apply", "--log-file", logFile)...)
		if code != 0 || rep.action(strayTree[0].PGID) != "reaped" {
			t.Fatalf("apply: exit %d, stray %q: %s", code, rep.action(strayTree[0].PGID), errOut)
		}
		deadline := time.Now().Add(10 * time.Second)
		for alive(strayTree) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d members of the stopped container's tree alive after reaping", alive(strayTree))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if alive(liveTree) != len(liveTree) {
			t.Fatal("the running container's tree lost a member")
		}
		// A removed pod container is listed exited, labels and all: its
		// audit line names the pod.
		audit, err := os.ReadFile(logFile)
		if err != nil || !strings.Contains(string(audit), "pod=kc-ns/kc-stopped/app") {
			t.Errorf("the audit log does not name the reaped tree's pod (%v):\n%s", err, audit)
		}
	})
}

// startCRITree starts a fake supervisor tree for container id, as the
// e2e tests do, and returns its members once all five are there.
func startCRITree(t *testing.T, id, comm string) []fingerprint.Stat {
	t.Helper()
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: id, Comm: comm, Children: 2, Stubborn: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms := group(t, k.PGID)
		if len(ms) >= 5 {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree of %d has %d members, want 5", k.PGID, len(ms))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
