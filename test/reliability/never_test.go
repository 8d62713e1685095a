//go:build reliability

package reliability

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

const (
	neverComm = "kcrel-never"
	nobody    = 65534
)

// protected is a group that must never be signalled.
type protected struct {
	what       string
	members    []fingerprint.Stat // identities that must stay alive
	bystanders []*bystander       // members that count signals
}

// harm counts the signals that reached the group.
func (p protected) harm() (int, []string) {
	n := 0
	var why []string
	for _, m := range p.members {
		if !fingerprint.Alive(procRoot, m) {
			n++
			why = append(why, fmt.Sprintf("%s: %d(%s) died", p.what, m.PID, m.Comm))
		} else if len(stoppedOf([]fingerprint.Stat{m})) > 0 {
			n++
			why = append(why, fmt.Sprintf("%s: %d(%s) stopped", p.what, m.PID, m.Comm))
		}
	}
	for _, b := range p.bystanders {
		if k, w := b.Harm(); k > 0 {
			n += k
			why = append(why, p.what+": "+w)
		}
	}
	return n, why
}

// TestNeverSignalled: groups that look like supervisor trees but must never
// be touched — a shell that started a supervisor by hand, a user session
// whose group a supervisor joined, another UID's tree, a running
// container's tree, a tree younger than --min-age — face kc-janitor
// reconcile --apply (fast and full scan) and kc-hook poststop, round after
// round, next to a genuine stray that must be reaped each time (so the
// runs provably act). Ground truth is a real podman API service.
func TestNeverSignalled(t *testing.T) {
	e := podmantest.New(t)
	url := e.StartAPI(t)
	running := e.Run(t)
	stopped := e.Run(t)
	stopContainer(t, e, stopped)
	sup := supervisorBin(t, neverComm)
	state := t.TempDir()
	env := append(e.Environ(), "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+neverComm, "KC_KILL_GRACE=300ms")
	reconcile := func(extra ...string) (reconcileJSON, toolRun) {
		args := append([]string{"reconcile", "--apply", "--format", "json", "--podman-url", url, "--kill-grace", "300ms",
			"--container", stopped, "--container", running}, extra...)
		r := runTool(t, janitorBin(t), env, "", args...)
		var rep reconcileJSON
		decodeJSON(t, r, &rep)
		return rep, r
	}

	const rounds = 3
	exposures := map[string]int{}
	signals := 0
	var harms []string
	strays, reaped := 0, 0
	for round := 0; round < rounds; round++ {
		// A shell that ran a supervisor by hand: bash leads the group.
		shell := exec.Command("bash", "-c", `exec -a "--container-id=$1" "$0" 1000000 & wait`, sup, stopped)
		shell.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		proc.Start(t, shell)
		var shellGroup []fingerprint.Stat
		proc.WaitFor(t, 10*time.Second, "the hand-started supervisor", func() bool {
			shellGroup = groupMembers(shell.Process.Pid)
			for _, m := range shellGroup {
				if m.Comm == neverComm {
					return true
				}
			}
			return false
		})
		foreignShell := protected{what: "foreign group (shell)", members: shellGroup,
			bystanders: []*bystander{mustBystander(t, inGroup(shell.Process.Pid), "")}}
		t.Cleanup(func() { killByIdentity(foreignShell.members) })

		// A user session (a bystander leads) that a supervisor joined.
		session := mustBystander(t, &syscall.SysProcAttr{Setpgid: true}, "")
		joined := startSupervisor(t, neverComm, stopped, inGroup(session.PID))
		foreignSession := protected{what: "foreign group (session)", members: []fingerprint.Stat{joined.Stat}, bystanders: []*bystander{session}}

		// Another UID's tree.
		cred := testutil.NobodyCredential()
		other := startSupervisor(t, neverComm, stopped, &syscall.SysProcAttr{Setpgid: true, Credential: cred})
		otherKernel := startKernel(t, &syscall.SysProcAttr{Setpgid: true, Pgid: other.PID, Credential: cred})
		otherUID := protected{what: "another UID's tree", members: []fingerprint.Stat{other.Stat, otherKernel.Stat}}

		// A running container's tree.
		live := startSupervisor(t, neverComm, running, &syscall.SysProcAttr{Setpgid: true})
		liveTree := protected{what: "running container's tree", members: []fingerprint.Stat{live.Stat},
			bystanders: []*bystander{mustBystander(t, inGroup(live.PID), "")}}

		// A genuine stray of the stopped container: young at first.
		stray := startSupervisor(t, neverComm, stopped, &syscall.SysProcAttr{Setpgid: true})
		strayKernel := startKernel(t, inGroup(stray.PID))
		young := protected{what: "young tree", members: []fingerprint.Stat{stray.Stat, strayKernel.Stat}}

		all := []protected{foreignShell, foreignSession, otherUID, liveTree}
		check := func(ps []protected, run string) {
			for _, p := range ps {
				exposures[p.what]++
				n, why := p.harm()
				signals += n
				for _, w := range why {
					harms = append(harms, run+": "+w)
				}
			}
		}

		// 1. --min-age 1h: everything is too young, or protected anyway.
		rep, r := reconcile("--min-age", "1h")
		if r.Code != 0 || rep.action(stray.PID) != "skipped-young" {
			t.Fatalf("--min-age 1h: exit %d, stray %q: %s", r.Code, rep.action(stray.PID), r.Stderr)
		}
		check(append(all, young), "reconcile --min-age 1h")

		// 2. --min-age 0s: the stray goes, nothing else.
		extra := []string{"--min-age", "0s"}
		if round%2 == 1 {
			extra = append(extra, "--full-scan")
		}
		rep, r = reconcile(extra...)
		strays++
		if rep.action(stray.PID) == "reaped" && waitAllDead(young.members, 5*time.Second) {
			reaped++
		} else {
			t.Errorf("round %d: the stray was not reaped: %q, exit %d: %s", round, rep.action(stray.PID), r.Code, r.Stderr)
		}
		for pgid, want := range map[int]string{other.PID: "skipped-other-uid", live.PID: "skipped-live"} {
			if got := rep.action(pgid); got != want {
				t.Errorf("round %d: group %d: %q, want %q", round, pgid, got, want)
			}
		}
		for _, pgid := range []int{shell.Process.Pid, session.PID} {
			if got := rep.action(pgid); got != "" && got != "skipped-foreign" {
				t.Errorf("round %d: foreign group %d: %q", round, pgid, got)
			}
		}
		check(all, "reconcile --min-age 0s "+fmt.Sprint(extra[2:]))

		// 3. The stopped container's poststop hook: it reaps the
		// container's trees of any UID (it runs as root and has the
		// runtime's word for the container), so the other UID's tree is
		// retired first; the foreign groups and the running container's
		// tree must survive, a fresh stray must not.
		killByIdentity(otherUID.members)
		stray2 := startSupervisor(t, neverComm, stopped, &syscall.SysProcAttr{Setpgid: true})
		stray2Members := []fingerprint.Stat{stray2.Stat, startKernel(t, inGroup(stray2.PID)).Stat}
		hr := runTool(t, hookBin(t), env, hookState(stopped), "poststop")
		strays++
		if hr.Code == 0 && waitAllDead(stray2Members, 5*time.Second) {
			reaped++
		} else {
			t.Errorf("round %d: poststop exit %d, stray alive %v: %s", round, hr.Code, aliveOf(stray2Members), hr.Stderr)
		}
		check([]protected{foreignShell, foreignSession, liveTree}, "kc-hook poststop")

		killByIdentity(foreignShell.members)
		session.Close()
		joined.Kill()
		live.Kill()
	}

	const area = "never-signalled"
	report(t, area, "rounds", rounds)
	report(t, area, "exposures_by_group", exposures)
	total := 0
	for _, n := range exposures {
		total += n
	}
	report(t, area, "exposures", total)
	report(t, area, "signals_to_protected_groups", signals)
	report(t, area, "control_strays_reaped", fmt.Sprintf("%d/%d", reaped, strays))
	if signals != 0 {
		t.Errorf("%d signals reached protected groups: %v", signals, harms)
	}
}
