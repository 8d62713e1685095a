//go:build reliability

package reliability

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

const rebootComm = "kcrel-boot"

// TestRebootLedger simulates a host reboot: the ledger holds records from
// another boot (and records with no boot ID) whose trees name, by exact
// identity — PID, start time, process group — processes that are alive
// now. A reboot makes such a match a coincidence, so those records must
// never be used to signal: kc-hook poststop and kc-janitor reconcile
// ignore them and reconcile --apply garbage-collects them. A control
// record with the current boot ID, naming the same kind of group, is
// reaped: the records are well-formed, only their boot differs.
func TestRebootLedger(t *testing.T) {
	state := t.TempDir()
	store, err := ledger.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	env := baseEnv(noContainersPodman(t)+":/usr/bin:/bin", "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+rebootComm, "KC_KILL_GRACE=200ms")

	// group starts a group that looks like a tree whose anchor died: a
	// leader with the supervisor comm and a member, neither carrying a
	// container ID; only a ledger record could tie it to a container.
	group := func() (*bystander, *bystander, ledger.Tree) {
		l := mustBystander(t, &syscall.SysProcAttr{Setpgid: true}, rebootComm)
		m := mustBystander(t, inGroup(l.PID), "")
		return l, m, ledger.Tree{PGID: l.PID, UID: 0, Source: "poststop", SeenAt: time.Now().UTC(), Members: []ledger.Process{
			{PID: l.PID, StartTicks: l.Stat.StartTicks, Comm: l.Stat.Comm},
			{PID: m.PID, StartTicks: m.Stat.StartTicks, Comm: m.Stat.Comm},
		}}
	}
	write := func(cid, boot string, tr ledger.Tree) {
		rec := ledger.Record{ContainerID: cid, BootID: boot, Trees: []ledger.Tree{tr}, Outcome: "would-not-die",
			Stages: map[string]time.Time{"poststop": time.Now().UTC()}, UpdatedAt: time.Now().UTC().Add(-time.Hour)}
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(store.Dir(), cid+".json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	const records = 12
	var cids []string
	var bystanders []*bystander
	for i := 0; i < records; i++ {
		cid := newCID(t)
		l, m, tr := group()
		boot := newCID(t)[:36] // another boot
		if i%4 == 3 {
			boot = "" // a record that names no boot at all
		}
		write(cid, boot, tr)
		cids = append(cids, cid)
		bystanders = append(bystanders, l, m)
	}
	scope := func() []string {
		var out []string
		for _, c := range cids {
			out = append(out, "--container", c)
		}
		return out
	}
	reconcile := func(apply bool) reconcileJSON {
		args := append([]string{"reconcile", "--format", "json", "--min-age", "0s", "--kill-grace", "200ms"}, janitorGround()...)
		if apply {
			args = append(args, "--apply")
		}
		r := runTool(t, janitorBin(t), env, "", append(args, scope()...)...)
		var rep reconcileJSON
		decodeJSON(t, r, &rep)
		if r.Code != 0 || !rep.LivenessKnown {
			t.Fatalf("reconcile: exit %d: %s", r.Code, r.Stderr)
		}
		return rep
	}

	// A dry run, the hooks of half the containers, then --apply.
	runs := 0
	if rep := reconcile(false); len(rep.Trees) != 0 {
		t.Errorf("dry run attributed trees from another boot: %+v", rep.Trees)
	}
	runs++
	for _, cid := range cids[:records/2] {
		r := runTool(t, hookBin(t), env, hookState(cid), "poststop")
		runs++
		if r.Code != 0 {
			t.Errorf("poststop: exit %d: %s", r.Code, r.Stderr)
		}
		if rec, err := store.Load(cid); err != nil || len(rec.Trees) != 0 || rec.BootID != store.CurrentBootID() {
			t.Errorf("poststop of %s used or kept the other boot's record: %+v, %v", cid[:12], rec, err)
		}
	}
	rep := reconcile(true)
	runs++
	if len(rep.Trees) != 0 {
		t.Errorf("--apply attributed trees from another boot: %+v", rep.Trees)
	}
	collected := 0
	for _, cid := range cids {
		if _, err := store.Load(cid); errors.Is(err, os.ErrNotExist) {
			collected++
		} else {
			t.Errorf("record %s not garbage-collected: %v", cid[:12], err)
		}
	}
	signals := 0
	for _, b := range bystanders {
		if n, why := b.Harm(); n > 0 {
			signals += n
			t.Error(why)
		}
	}

	// Control: the same kind of record from this boot is acted on.
	cid := newCID(t)
	l, m, tr := group()
	write(cid, store.CurrentBootID(), tr)
	cids = []string{cid}
	rep = reconcile(true)
	controlReaped := rep.action(l.PID) == "reaped" && asChild(l).WaitDead(5*time.Second) && asChild(m).WaitDead(5*time.Second)
	if !controlReaped {
		t.Errorf("a current-boot record naming a live group was not used: %+v", rep)
	}

	const area = "reboot"
	report(t, area, "stale_records_planted", records)
	report(t, area, "hook_and_janitor_runs", runs)
	report(t, area, "processes_named_by_stale_records", len(bystanders))
	report(t, area, "signals_to_them", signals)
	report(t, area, "stale_records_garbage_collected", collected)
	report(t, area, "control_current_boot_record_reaped", controlReaped)
}
