package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestPinInitRefusals: a process is pinned as a container's init only
// with the recorded start time, in a cgroup naming the container; a
// process already reaped is reported dead, not refused.
func TestPinInitRefusals(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("9e", 32)
	if _, err := pinInit("/proc", id, pid, st.StartTicks+1); !errors.Is(err, errStartMismatch) {
		t.Errorf("start time off by one tick: %v, want %v", err, errStartMismatch)
	}
	if _, err := pinInit("/proc", id, pid, st.StartTicks); !errors.Is(err, errNotItsCgroup) {
		t.Errorf("a host process: %v, want %v", err, errNotItsCgroup)
	}
	// Unrecorded, a live stranger holding the PID is no init of the
	// container either.
	if _, err := pinInit("/proc", id, pid, 0); !errors.Is(err, errNotItsCgroup) {
		t.Errorf("a host process, unrecorded: %v, want %v", err, errNotItsCgroup)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := pinInit("/proc", id, pid, st.StartTicks); !errors.Is(err, errInitDead) {
		t.Errorf("a reaped process: %v, want %v", err, errInitDead)
	}
	// Without a record, a PID nobody holds is no proof of a death: an
	// engine in another PID namespace gives PIDs of its own.
	if _, err := pinInit("/proc", id, pid, 0); !errors.Is(err, errInitUnseen) || errors.Is(err, errInitDead) {
		t.Errorf("a PID nobody holds, unrecorded: %v, want %v", err, errInitUnseen)
	}
	// Nor is a stranger's zombie holding it.
	z := exec.Command("true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Wait() })
	proc.WaitState(t, "/proc", z.Process.Pid, "Z", 10*time.Second)
	if _, err := pinInit("/proc", id, z.Process.Pid, 0); errors.Is(err, errInitDead) || err == nil {
		t.Errorf("a stranger's zombie, unrecorded: %v, want a refusal", err)
	}
}

// TestPinnerUnseenPIDIsNoDeath: an answer naming, for a live container, a
// PID no process holds here (an engine in another PID namespace) reports
// no death, which would take the container for gone; the container is
// followed by events and relists.
func TestPinnerUnseenPIDIsNoDeath(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pn, deaths := recordingPinner(t)
	id := strings.Repeat("7c", 32)
	pn.refresh(engine.Truth{Answers: []engine.Answer{{Engine: "docker", Containers: []engine.Container{{ID: id, Live: true, InitPID: cmd.Process.Pid}}}}, Asked: time.Now()})
	if pinned, eventsOnly := pn.counts(); pinned != 0 || eventsOnly != 1 {
		t.Errorf("pinned %d, events only %d; want 0, 1", pinned, eventsOnly)
	}
	if ds := deaths(); len(ds) != 0 {
		t.Errorf("deaths reported: %+v", ds)
	}
}

// TestPinnerReportsADeadInitOnce: an engine that has not caught up with
// a death (podman whose conmon died writes no exit) lists the container
// live, with its dead init, at every answer: the death is reported once,
// not at each answer, where each would be decided anew; another dead PID
// is another death, as is the relist's once the engine catches up, and
// the same PID listed again after that.
func TestPinnerReportsADeadInitOnce(t *testing.T) {
	id := strings.Repeat("5d", 32)
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	record := func(st fingerprint.Stat) {
		if err := store.Update(id, func(r *ledger.Record) error {
			r.Init = &ledger.Process{PID: st.PID, StartTicks: st.StartTicks}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// deadInit records a reaped process as id's init.
	deadInit := func() fingerprint.Stat {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		st, err := fingerprint.ReadStat("/proc", cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Process.Kill()
		cmd.Wait()
		record(st)
		return st
	}
	pn, deaths := recordingPinnerWith(t, func() *ledger.Store { return store })
	asked := time.Now()
	refresh := func(live bool, pid int) int {
		asked = asked.Add(time.Second)
		a := engine.Answer{Engine: "podman", Endpoint: "unix:///run/podman/podman.sock"}
		if live {
			a.Containers = []engine.Container{{ID: id, Live: true, InitPID: pid}}
		}
		pn.refresh(engine.Truth{Answers: []engine.Answer{a}, Asked: asked})
		return len(deaths())
	}
	first := deadInit()
	for i := range 3 {
		if n := refresh(true, first.PID); n != 1 {
			t.Fatalf("answer %d listing the dead init: %d deaths reported, want 1", i+1, n)
		}
	}
	if n := refresh(true, deadInit().PID); n != 2 {
		t.Errorf("another dead init: %d deaths, want 2", n)
	}
	// The engine catches up: the container it stops listing is a death
	// the relist tells.
	if n := refresh(false, 0); n != 3 {
		t.Errorf("no longer listed: %d deaths, want 3", n)
	}
	record(first)
	if n := refresh(true, first.PID); n != 4 {
		t.Errorf("listed again after it was gone: %d deaths, want 4", n)
	}
}

// TestPinnerTakesNoUsersInitOfRootsContainer: a user's engine listing a
// container root's engine lists too, naming a process of his own as its
// init, is not believed: that process is never pinned (its death would
// call root's container gone).
func TestPinnerTakesNoUsersInitOfRootsContainer(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	id := strings.Repeat("5d", 32)
	for _, tc := range []struct {
		name    string
		answers []engine.Answer
		tried   bool
	}{
		{"root's engine alone", []engine.Answer{{Engine: "podman", UID: 0, Containers: []engine.Container{{ID: id, Live: true, InitPID: cmd.Process.Pid}}}}, true},
		{"a user's engine too", []engine.Answer{
			{Engine: "docker", UID: 0, Containers: []engine.Container{{ID: id, Live: true}}},
			{Engine: "podman", UID: 1000, Containers: []engine.Container{{ID: id, Live: true, InitPID: cmd.Process.Pid}}},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pn, _ := recordingPinner(t)
			pn.refresh(engine.Truth{Answers: tc.answers, Asked: time.Now()})
			pn.mu.Lock()
			_, tried := pn.refused[id]
			pn.mu.Unlock()
			// The sleep is in no container's cgroup: a pin tried is refused.
			if tried != tc.tried {
				t.Errorf("the PID tried for a pin: %v, want %v", tried, tc.tried)
			}
		})
	}
}

// TestPinnerUnpinnedGoneIsADeath: a live container no pin holds (its
// init unseen here, or no PID given: CRI without events, podman's CLI) is
// reported dead by the first answer of its engine that no longer lists it,
// dated to when the last answer listing it was asked; not by an answer of
// another engine, nor by one asked before the newest applied (a round's,
// applied after its scan) or the newest again, nor while it is listed,
// nor twice; and not
// when the answer drops more than half of what its engine listed (a list
// gone wrong).
func TestPinnerUnpinnedGoneIsADeath(t *testing.T) {
	pn, deaths := recordingPinner(t)
	gone, stays, other := strings.Repeat("1a", 32), strings.Repeat("2b", 32), strings.Repeat("3c", 32)
	cri := func(ids ...string) engine.Answer {
		a := engine.Answer{Engine: "cri", Endpoint: "/run/crio/crio.sock", UID: 0}
		for _, id := range ids {
			a.Containers = append(a.Containers, engine.Container{ID: id, Live: true})
		}
		return a
	}
	podman := engine.Answer{Engine: "podman", Endpoint: "unix:///run/podman/podman.sock", Containers: []engine.Container{{ID: other, Live: true}}}
	noneLeft := engine.Answer{Engine: podman.Engine, Endpoint: podman.Endpoint}
	t0 := time.Now().Add(-time.Hour)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	truth := func(asked time.Time, as ...engine.Answer) engine.Truth {
		return engine.Truth{Answers: as, Asked: asked}
	}

	pn.refresh(truth(at(1), cri(gone, stays), podman))
	pn.refresh(truth(at(2), cri(gone, stays), podman))
	// Only podman answers: nothing is known of the CRI runtime's.
	pn.refresh(truth(at(3), podman))
	// Asked before the newest: a round's answer applied after its scan.
	pn.refresh(truth(at(2), cri(stays), noneLeft))
	if ds := deaths(); len(ds) != 0 {
		t.Fatalf("deaths before any answer of their engine left them out: %+v", ds)
	}
	pn.refresh(truth(at(4), cri(gone, stays), podman))
	pn.refresh(truth(at(5), cri(stays), noneLeft))
	ds := deaths()
	slices.SortFunc(ds, func(a, b engine.Death) int { return strings.Compare(a.ID, b.ID) })
	want := []engine.Death{{Engine: "cri", ID: gone, At: at(4), Via: "relist"}, {Engine: "podman", ID: other, At: at(4), Via: "relist"}}
	if !slices.EqualFunc(ds, want, func(a, b engine.Death) bool {
		return a.Engine == b.Engine && a.ID == b.ID && a.At.Equal(b.At) && a.Via == b.Via
	}) {
		t.Errorf("deaths %+v; want %+v", ds, want)
	}
	pn.refresh(truth(at(6), cri(stays), noneLeft))
	if ds := deaths(); len(ds) != 2 {
		t.Errorf("reported again: %+v", ds)
	}

	// Three of four gone at once from one engine's list: no deaths until
	// its next answer says so too; none if it lists them again.
	ids := []string{strings.Repeat("4d", 32), strings.Repeat("5e", 32), strings.Repeat("6f", 32)}
	pn.refresh(truth(at(7), cri(append(slices.Clone(ids), stays)...)))
	pn.refresh(truth(at(8), cri(stays)))
	// The same answer again (a death's question narrowed from it keeps
	// its time) is no second answer.
	pn.refresh(truth(at(8), cri(stays)))
	if ds := deaths(); len(ds) != 2 {
		t.Errorf("a list that lost most of its containers reported deaths at once: %+v", ds[2:])
	}
	pn.refresh(truth(at(9), cri(append(slices.Clone(ids), stays)...)))
	pn.refresh(truth(at(10), cri(append(slices.Clone(ids), stays)...)))
	if ds := deaths(); len(ds) != 2 {
		t.Errorf("containers listed again reported dead: %+v", ds[2:])
	}
	pn.refresh(truth(at(11), cri(stays)))
	pn.refresh(truth(at(12), cri(stays)))
	ds = deaths()
	if len(ds) != 5 {
		t.Fatalf("deaths %+v; want the three confirmed by the next answer", ds[2:])
	}
	for _, d := range ds[2:] {
		if !slices.Contains(ids, d.ID) || !d.At.Equal(at(10)) || d.Via != "relist" {
			t.Errorf("death %+v; want one of the three, dated when last listed", d)
		}
	}
}

// TestPinnerPodman: a real podman container's init is pinned, and not
// with a start time other than its own; `podman kill` makes its pidfd
// report the death at once; one PID given for two containers is pinned
// for neither.
func TestPinnerPodman(t *testing.T) {
	pm := podmantest.New(t)
	id, other := pm.Run(t), pm.Run(t)
	pid := pm.InitPID(t, id)
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pinInit("/proc", id, pid, st.StartTicks+1); !errors.Is(err, errStartMismatch) {
		t.Errorf("the init with another start time: %v, want %v", err, errStartMismatch)
	}
	if _, err := pinInit("/proc", other, pid, 0); !errors.Is(err, errNotItsCgroup) {
		t.Errorf("the init given for another container: %v, want %v", err, errNotItsCgroup)
	}
	p, err := pinInit("/proc", id, pid, st.StartTicks)
	if err != nil {
		t.Fatalf("the container's own init: %v", err)
	}
	p.Close()

	pn, deaths := recordingPinner(t)
	otherPID := pm.InitPID(t, other)
	answers := []engine.Answer{{Engine: "podman", Containers: []engine.Container{
		{ID: id, Live: true, InitPID: pid},
		{ID: other, Live: true, InitPID: otherPID},
		{ID: strings.Repeat("5a", 32), Live: true, InitPID: otherPID},
	}}, {Engine: "docker", Containers: []engine.Container{{ID: strings.Repeat("d0", 32), Live: true}}}}
	// doctor's view first: it pins nothing it keeps.
	if pinned, eventsOnly, why := pinnable(Settings{StateDir: t.TempDir()}, answers, nil); pinned != 1 || eventsOnly != 3 || len(why) != 2 {
		t.Errorf("doctor: pinnable %d, events only %d (%v); want 1, and 3 for two reasons", pinned, eventsOnly, why)
	}
	pn.refresh(engine.Truth{Answers: answers, Asked: time.Now()})
	if pinned, eventsOnly := pn.counts(); pinned != 1 || eventsOnly != 3 {
		t.Fatalf("pinned %d, events only %d; want 1, and the two sharing a PID and the one without a PID", pinned, eventsOnly)
	}
	if _, err := pm.Podman("kill", id); err != nil {
		t.Fatal(err)
	}
	proc.WaitFor(t, 10*time.Second, "the pidfd's death", func() bool { return len(deaths()) == 1 })
	if d := deaths()[0]; d.ID != id || d.Engine != "podman" || d.Via != "pidfd" {
		t.Errorf("death %+v", d)
	}
	if pinned, _ := pn.counts(); pinned != 0 {
		t.Errorf("%d pins left after the death", pinned)
	}
}

// TestPinnerDocker: Docker's list gives no init PID; the pinner asks
// inspect's State.Pid and pins it, doctor counts it as pinnable, and
// without an answer (and no ledger record) the container is followed by
// events and relists.
func TestPinnerDocker(t *testing.T) {
	dt := dockertest.Need(t)
	id := dt.Run(t, nil)
	es, err := engine.Select([]string{"docker"}, engine.Config{DockerURL: dt.URL})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	ask := func(by listedBy, ids []string) map[string]int {
		return askInitPIDs(context.Background(), es, by, ids, 0, log)
	}
	// The list's answer as docker gives it: its endpoint, and the UID of
	// the dockerd that answered (this test's: root).
	answer := engine.Answer{Engine: "docker", Endpoint: es[0].Endpoint(), UID: os.Geteuid(), Containers: []engine.Container{{ID: id, Live: true}}}
	if got := ask(listedIn(answer), []string{id}); got[id] != dt.InitPID(t, id) {
		t.Fatalf("asked %v, want %s's State.Pid %d", got, id, dt.InitPID(t, id))
	}
	// A list from another UID, or through another endpoint, does not
	// vouch for this dockerd's inspect.
	otherUID, otherEndpoint := answer, answer
	otherUID.UID = os.Geteuid() + 4321
	otherEndpoint.Endpoint = "unix:///nonexistent/docker.sock"
	for _, a := range []engine.Answer{otherUID, otherEndpoint} {
		if got := ask(listedIn(a), []string{id}); len(got) != 0 {
			t.Errorf("asked for a list by %+v: %v, want no answer taken", listedIn(a), got)
		}
	}
	for _, tc := range []struct {
		name           string
		answer         engine.Answer
		ask            func(listedBy, []string) map[string]int
		pinned, evOnly int
	}{
		{"asked through inspect", answer, ask, 1, 0},
		{"not asked", answer, nil, 0, 1},
		{"listed by another UID", otherUID, ask, 0, 1},
	} {
		answers := []engine.Answer{tc.answer}
		t.Run(tc.name, func(t *testing.T) {
			if pinned, eventsOnly, why := pinnable(Settings{StateDir: t.TempDir()}, answers, tc.ask); pinned != tc.pinned || eventsOnly != tc.evOnly {
				t.Errorf("doctor: pinnable %d, events only %d (%v); want %d, %d", pinned, eventsOnly, why, tc.pinned, tc.evOnly)
			}
			pn, err := newPinner("/proc", log, nil, nil, func(engine.Death) {})
			if err != nil {
				t.Fatal(err)
			}
			defer pn.close()
			pn.askPID = tc.ask
			pn.refresh(engine.Truth{Answers: answers, Asked: time.Now()})
			pn.settle()
			if pinned, eventsOnly := pn.counts(); pinned != tc.pinned || eventsOnly != tc.evOnly {
				t.Errorf("pinned %d, events only %d; want %d, %d", pinned, eventsOnly, tc.pinned, tc.evOnly)
			}
		})
	}
}

// TestPinnerAsksAgainAfterADeath: Docker's list names no init, so the
// pinner asks inspect; an init that exited before the pin (a crash loop's)
// is refused. Once a death of that container is reported, its next init
// is asked for again (after pinRelist, so as not to name the dead one),
// rather than the container being followed by events for its life.
func TestPinnerAsksAgainAfterADeath(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("6e", 32)
	pn, _ := recordingPinner(t)
	var mu sync.Mutex
	asked := 0
	pn.askPID = func(_ listedBy, ids []string) map[string]int {
		mu.Lock()
		defer mu.Unlock()
		asked++
		return map[string]int{id: gone.Process.Pid}
	}
	answer := engine.Truth{Answers: []engine.Answer{{Engine: "docker", Containers: []engine.Container{{ID: id, Live: true}}}}}
	refresh := func() int {
		answer.Asked = time.Now()
		pn.refresh(answer)
		pn.settle()
		mu.Lock()
		defer mu.Unlock()
		return asked
	}
	if n := refresh(); n != 1 {
		t.Fatalf("asked %d times, want once", n)
	}
	if n := refresh(); n != 1 {
		t.Fatalf("refused, then asked %d times before any death, want once", n)
	}
	pn.died(id)
	if n := refresh(); n != 1 {
		t.Fatalf("asked %d times right after the death, want still once (the dead init)", n)
	}
	pn.mu.Lock()
	pn.diedAt[id] = time.Now().Add(-pinRelist)
	pn.mu.Unlock()
	if n := refresh(); n != 2 {
		t.Errorf("asked %d times once the death is pinRelist old, want twice", n)
	}
}

// settle waits for the init PIDs asked in the background to be applied.
func (p *pinner) settle() {
	for {
		p.mu.Lock()
		asking := p.asking
		p.mu.Unlock()
		if !asking {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// recordingPinner returns a pinner on /proc, closed when t ends, and a
// function returning the deaths it has reported so far.
func recordingPinner(t *testing.T) (*pinner, func() []engine.Death) {
	t.Helper()
	return recordingPinnerWith(t, nil)
}

// recordingPinnerWith is recordingPinner reading the ledger store gives.
func recordingPinnerWith(t *testing.T, store func() *ledger.Store) (*pinner, func() []engine.Death) {
	t.Helper()
	var mu sync.Mutex
	var deaths []engine.Death
	pn, err := newPinner("/proc", slog.New(slog.DiscardHandler), nil, store, func(d engine.Death) {
		mu.Lock()
		deaths = append(deaths, d)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pn.close)
	return pn, func() []engine.Death {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(deaths)
	}
}

// TestCheckInit: a container's init is PID 1 of a namespace right below
// ours, in the container's cgroup; a PID 1 nested deeper (a sandbox
// in the container) or a process that is no namespace's init is not.
func TestCheckInit(t *testing.T) {
	const pid = 4242
	id := strings.Repeat("c3", 32)
	cgroup := "0::/machine.slice/libpod-" + id + ".scope/container\n"
	for _, tt := range []struct {
		name, cgroup, nspid string
		want                error
	}{
		{"the init", cgroup, "4242\t1", nil},
		{"a sandbox nested in the container", cgroup, "4242\t57\t1", errNotPIDNSInit},
		{"a sandbox nested in the container, its PID there ours", cgroup, "4242\t4242\t1", errNotPIDNSInit},
		{"a process of the container", cgroup, "4242\t57", errNotPIDNSInit},
		{"a process of ours", cgroup, "4242", errNotPIDNSInit},
		{"another container's init", "0::/machine.slice/libpod-" + strings.Repeat("d4", 32) + ".scope\n", "4242\t1", errNotItsCgroup},
		{"systemd as its init (podman --systemd)", "0::/machine.slice/libpod-" + id + ".scope/init.scope\n", "4242\t1", nil},
		{"docker's, cgroup v1", "12:pids:/docker/" + id + "\n1:name=systemd:/docker/" + id + "\n", "4242\t1", nil},
		{"its monitor's cgroup", "0::/machine.slice/libpod-conmon-" + id + ".scope\n", "4242\t1", errNotItsCgroup},
		{"kc-watchman's cgroup named after it", "0::/kc-watchman/" + id + "\n", "4242\t1", errNotItsCgroup},
		{"a cgroup merely naming it", "0::/user.slice/session-" + id + ".scope\n", "4242\t1", errNotItsCgroup},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, strconv.Itoa(pid))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			status := fmt.Sprintf("Name:\tinit\nTgid:\t%d\nPid:\t%d\nNSpid:\t%s\n", pid, pid, tt.nspid)
			for name, data := range map[string]string{"cgroup": tt.cgroup, "status": status} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := checkInit(root, id, pid); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("checkInit = %v, want %v", err, tt.want)
			}
		})
	}
}
