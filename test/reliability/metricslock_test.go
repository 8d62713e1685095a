//go:build reliability

package reliability

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdFlock starts `flock -x target sleep` as uid in its own process group
// (killed by group when t ends: flock's sleep holds the lock too) and
// returns once target is locked.
func holdFlock(t testing.TB, target string, uid int) {
	t.Helper()
	flockBin, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) not installed")
	}
	attr := &syscall.SysProcAttr{Setpgid: true}
	if uid != os.Geteuid() {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
	}
	c, err := startChild(flockBin, []string{"flock", "-x", target, "sleep", "600"}, attr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.Dead() {
			_ = syscall.Kill(-c.PID, syscall.SIGKILL)
		}
		c.WaitDead(10 * time.Second)
	})
	f, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return
		}
		if err == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		}
		if c.Dead() || time.Now().After(deadline) {
			t.Fatalf("flock as uid %d never took %s", uid, target)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMetricsLockNobodyCanHold (issue 16 item 3): a user who can read the
// metrics directory holds an flock on it (what the old writer waited on
// forever) and the run does not notice; that user cannot even open the
// janitor's lock file; a second writer of the janitor's own UID stuck
// holding the lock makes the run give up after its bounded wait, exit 1,
// file untouched.
func TestMetricsLockNobodyCanHold(t *testing.T) {
	dir := shortDir(t, "kcrel-metrics")
	if err := os.Chmod(dir, 0o755); err != nil { // as node_exporter's textfile dir
		t.Fatal(err)
	}
	mf := filepath.Join(dir, "kc-janitor.prom")
	lock := filepath.Join(dir, ".kc-janitor.prom.lock")
	socks := shortDir(t, "kcrel-msock")
	env := baseEnv("/usr/bin:/bin")
	sweep := func() toolRun {
		return runTool(t, janitorBin(t), env, "", "sweep", "--socket-dir", socks, "--metrics-file", mf)
	}

	holdFlock(t, dir, nobody)
	r := sweep()
	if r.Code != 0 {
		t.Fatalf("sweep with the directory locked by uid %d: exit %d: %s", nobody, r.Code, r.Stderr)
	}
	written, err := os.ReadFile(mf)
	if err != nil || !strings.Contains(string(written), `kc_janitor_run_success{command="sweep"} 1`) {
		t.Fatalf("metrics file after the run: %v\n%s", err, written)
	}
	report(t, "metrics-lock", "run_with_directory_locked_by_another_user_s", r.Took.Seconds())

	// The lock file exists now (0600, root): nobody cannot open it to hold it.
	held := runTool(t, "/usr/bin/setpriv", env, "", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		"flock", "-n", "-x", lock, "true")
	if held.Code == 0 {
		t.Fatalf("uid %d could take the janitor's metrics lock", nobody)
	}
	report(t, "metrics-lock", "other_user_can_open_lock", false)

	// A stuck writer of the janitor's own UID: bounded wait, then exit 1.
	holdFlock(t, lock, os.Geteuid())
	r = sweep()
	if r.Code != 1 || !strings.Contains(r.Stderr, "metrics not written") {
		t.Fatalf("sweep with the lock held: exit %d, want 1 saying metrics not written: %s", r.Code, r.Stderr)
	}
	if now, _ := os.ReadFile(mf); string(now) != string(written) {
		t.Errorf("a run that gave up changed the file")
	}
	if r.Took > 30*time.Second {
		t.Errorf("gave up after %v", r.Took)
	}
	report(t, "metrics-lock", "gave_up_on_held_lock_after_s", r.Took.Seconds())
}
