//go:build reliability

package reliability

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestMetricsLockNobodyCanHold: a user who can read the
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

	testutil.HoldFlock(t, dir, nobody)
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
	testutil.HoldFlock(t, lock, os.Geteuid())
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
