package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestBaseSpecKeepsContainerdLimits: a base spec replaces containerd's
// default spec, so one that carries rlimits imposes them on every pod of
// its handler. The shipped spec, as install-hook writes it, must leave
// the process limits exactly as containerd sets them without a base spec
// (a second handler, "plain", has none). With containerd 1.6's default
// spec's RLIMIT_NOFILE 1024:1024 in it, the limits differed.
func TestBaseSpecKeepsContainerdLimits(t *testing.T) {
	shipped, err := os.ReadFile("../../contrib/containerd/base-runtime-spec.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Process map[string]json.RawMessage `json:"process"`
	}
	if err := json.Unmarshal(shipped, &doc); err != nil || doc.Process == nil {
		t.Fatalf("shipped base spec: %v", err)
	}
	if _, ok := doc.Process["rlimits"]; ok {
		t.Error("the shipped base spec sets process.rlimits")
	}
	hook := testutil.Build(t, testutil.KCHookPackage, "kc-hook")
	janitor := testutil.Build(t, testutil.KCJanitorPackage, "kc-janitor")
	dir := t.TempDir()
	specOut := filepath.Join(dir, "base-spec.json")
	// The DaemonSet's init container step: kc-hook onto the node, and the
	// base spec naming it.
	run(t, janitor, "install-hook", "--from", hook, "--to", dir,
		"--base-spec", "../../contrib/containerd/base-runtime-spec.json", "--base-spec-out", specOut)
	// The hook the spec names records into this test's state dir, never
	// the host's default.
	spec, err := os.ReadFile(specOut)
	if err != nil {
		t.Fatal(err)
	}
	spec = []byte(strings.ReplaceAll(string(spec), `"env": [`, `"env": ["KC_STATE_DIR=`+t.TempDir()+`", `))
	if !strings.Contains(string(spec), "KC_STATE_DIR=") {
		t.Fatal("install-hook's spec has no env list to add the state dir to")
	}
	if err := os.WriteFile(specOut, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := criContainerd(t, specOut, `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.plain]
  runtime_type = "io.containerd.runc.v2"
`)
	containerdtest.ImportImage(t, sock, "k8s.io")
	rs := criClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	limits := func(handler string) string {
		t.Helper()
		id := runPodContainerWith(ctx, t, rs, "kc-limits-"+handler, handler)
		st, err := rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
			t.Fatalf("verbose status of %s: %v", id, err)
		}
		pid := info.PID
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
		if err != nil || pid <= 0 {
			t.Fatalf("limits of %s's init (pid %d): %v", handler, pid, err)
		}
		return string(b)
	}
	plain, ours := limits("plain"), limits("runc")
	if plain != ours {
		t.Fatalf("the base spec changes the containers' limits:\nwithout it:\n%s\nwith it:\n%s", plain, ours)
	}
	t.Logf("limits kept as containerd sets them:\n%s", ours)
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return string(out)
}
