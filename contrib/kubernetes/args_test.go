package kubernetes

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerdtest"
	"github.com/kc-watchman/kc-watchman/internal/testkit"
)

// TestJanitorRunsWithManifestArgs runs kc-janitor with exactly the
// DaemonSet's args and env, against the private containerd mounted where
// the manifest expects containerd's socket: in a mount namespace of its
// own, /run and /var/lib are fresh tmpfs, /run/containerd is the private
// containerd's directory and the textfile directory is this test's. The
// janitor must get through a whole round (its metrics file appears) with
// no usage error, and stop cleanly on SIGTERM (exit 143).
func TestJanitorRunsWithManifestArgs(t *testing.T) {
	addr := containerdtest.Address(t)
	if filepath.Base(addr) != "containerd.sock" {
		t.Fatalf("%s: the private containerd's socket must be named containerd.sock", addr)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	_, c := janitor(t)
	bin := testkit.Build(t, testkit.KCJanitorPackage, "kc-janitor")
	textfile := t.TempDir()

	var metrics string
	for i, a := range c.Args {
		if a == "--metrics-file" && i+1 < len(c.Args) {
			metrics = c.Args[i+1]
		}
	}
	if filepath.Dir(metrics) != "/var/lib/node-exporter" {
		t.Fatalf("metrics file %q is not in /var/lib/node-exporter", metrics)
	}
	script := `set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /run
mkdir -p /run/containerd /run/kc-watchman
mount --bind "$CTRD_DIR" /run/containerd
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/node-exporter
mount --bind "$TEXTFILE" /var/lib/node-exporter
exec "$@"`
	cmd := exec.Command("unshare", append([]string{"-m", "sh", "-c", script, "sh", bin}, c.Args...)...)
	env := []string{"PATH=" + os.Getenv("PATH"), "CTRD_DIR=" + filepath.Dir(addr), "TEXTFILE=" + textfile}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
	})
	prom := filepath.Join(textfile, filepath.Base(metrics))
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(prom); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("kc-janitor %s exited before a round was done: %v\n%s", strings.Join(c.Args, " "), err, stderr.String())
		case <-deadline:
			t.Fatalf("no metrics file after 60s\n%s", stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The file is written at the end of the first round; reconcile must
	// have known the truth from containerd.
	data, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "ground truth unknown") {
		t.Errorf("containerd was not asked successfully:\n%s", stderr.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		// 143: stopped by SIGTERM after its round, as a shell reports it.
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
			t.Fatalf("after SIGTERM: %v, want exit status 143\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after SIGTERM\n%s", stderr.String())
	}
	t.Logf("metrics file: %d bytes; log:\n%s", len(data), stderr.String())
}
