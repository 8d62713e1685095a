//go:build reliability

package reliability

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

const auditComm = "kcrel-audit"

// TestDryRunCreatesStateDir (DESIGN "Ledger"): on a janitor-only host
// in its audit weeks there is no state dir yet. A dry run against a real
// podman creates it (0700) and snapshots the live container's tree, so
// that when the supervisor later dies and the container stops, the next
// dry run still attributes the orphaned kernel and shows it as would-reap.
func TestDryRunCreatesStateDir(t *testing.T) {
	e := podmantest.New(t)
	url := e.StartAPI(t)
	id := e.Run(t)
	sup := startSupervisor(t, auditComm, id, &syscall.SysProcAttr{Setpgid: true})
	kernel := startKernel(t, inGroup(sup.PID))

	state := filepath.Join(t.TempDir(), "kc-watchman") // not there yet
	env := baseEnv(t.TempDir(), "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+auditComm)
	dryRun := func() reconcileJSON {
		t.Helper()
		r := runTool(t, janitorBin(t), env, "", "reconcile", "--format", "json", "--engine", "podman",
			"--podman-url", url, "--min-age", "0s", "--container", id)
		var rep reconcileJSON
		decodeJSON(t, r, &rep)
		if r.Code != 0 || !rep.LivenessKnown || !rep.DryRun {
			t.Fatalf("dry run: exit %d, report %+v: %s", r.Code, rep, r.Stderr)
		}
		return rep
	}

	if a := dryRun().action(sup.PID); a != "skipped-live" {
		t.Fatalf("live container's tree: %q, want skipped-live", a)
	}
	info, err := os.Stat(state)
	if err != nil || !info.IsDir() || info.Mode().Perm() != 0o700 {
		t.Fatalf("state dir after a dry run: %v %v, want a 0700 directory", info, err)
	}
	store, err := ledger.OpenReadOnly(state)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(id)
	if err != nil || len(rec.Trees) != 1 || rec.Trees[0].PGID != sup.PID || len(rec.Trees[0].Members) != 2 {
		t.Fatalf("snapshot after a dry run: %+v, %v", rec, err)
	}
	report(t, "dry-run-state", "state_dir_mode", "0700")

	// The supervisor crashes, its kernel lives on; the container stops.
	sup.Kill()
	stopContainer(t, e, id)
	rep := dryRun()
	if a := rep.action(sup.PID); a != "would-reap" {
		t.Errorf("orphaned kernel (group %d): %q, want would-reap through the snapshot\n%+v", sup.PID, a, rep)
	}
	if n := len(aliveOf([]fingerprint.Stat{kernel.Stat})); n != 1 {
		t.Error("a dry run killed the kernel")
	}
	report(t, "dry-run-state", "orphan_attributed_after_supervisor_crash", rep.action(sup.PID) == "would-reap")
}
