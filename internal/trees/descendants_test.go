package trees

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	tproc "github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// escapeFixture is a member (bash, leading its own group) with a child in
// a session of its own, and an unrelated process of the same UID in a
// session of its own.
type escapeFixture struct {
	member, setsid, bystander fingerprint.Identity
}

func startEscapeFixture(t *testing.T) escapeFixture {
	t.Helper()
	member := exec.Command("bash", "-c", "setsid sleep 1000000 & wait")
	member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	tproc.StartGroup(t, member)
	by := tproc.Sleep(t, &syscall.SysProcAttr{Setsid: true})
	var f escapeFixture
	tproc.WaitFor(t, 5*time.Second, "the member's setsid child", func() bool {
		for _, c := range Children(fingerprint.DefaultRoot, member.Process.Pid) {
			if id, err := fingerprint.Read(fingerprint.DefaultRoot, c); err == nil && id.PGID == c && id.Comm == "sleep" {
				f.setsid = id
				return true
			}
		}
		return false
	})
	// The setsid child is in a group of its own: KillGroup of the member's
	// group would miss it.
	t.Cleanup(func() {
		if p, err := fingerprint.Pin(fingerprint.DefaultRoot, f.setsid.Stat); err == nil {
			p.Signal(syscall.SIGKILL)
			p.Close()
		}
	})
	var err error
	if f.member, err = fingerprint.Read(fingerprint.DefaultRoot, member.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if f.bystander, err = fingerprint.Read(fingerprint.DefaultRoot, by.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f escapeFixture) rules() Rules {
	return Rules{InGroup: func(pgid int) bool { return pgid == f.member.PGID }, UID: f.member.UID, ContainerID: cidA}
}

func pids(ids []fingerprint.Identity) []int {
	var out []int
	for _, id := range ids {
		out = append(out, id.PID)
	}
	return out
}

// TestDescendantsFromChildrenFiles: without parent links (the /proc
// listing), the member's setsid child is found through its children
// files, and nothing else is.
func TestDescendantsFromChildrenFiles(t *testing.T) {
	f := startEscapeFixture(t)
	esc, withheld := Descendants(fingerprint.DefaultRoot, nil, []fingerprint.Identity{f.member}, f.rules())
	if got := pids(esc); len(got) != 1 || got[0] != f.setsid.PID || len(withheld) != 0 {
		t.Fatalf("escaped %v withheld %v, want [%d] and none", got, pids(withheld), f.setsid.PID)
	}
}

// TestDescendantsTrustNoStaleLink: a listing whose parent link names a
// member as the parent of a process that is not its child (the PID was
// reused since the listing, or the listing is wrong) makes nothing of it:
// the link is checked against the process itself before it counts. The
// real child, linked right, is found.
func TestDescendantsTrustNoStaleLink(t *testing.T) {
	f := startEscapeFixture(t)
	l := &proctable.Listing{
		PIDs:  []int{f.member.PID, f.setsid.PID, f.bystander.PID},
		PGIDs: []int32{int32(f.member.PGID), int32(f.setsid.PGID), int32(f.bystander.PGID)},
		PPIDs: []int32{int32(f.member.PPID), int32(f.member.PID), int32(f.member.PID)},
	}
	esc, withheld := Descendants(fingerprint.DefaultRoot, l, []fingerprint.Identity{f.member}, f.rules())
	if got := pids(esc); len(got) != 1 || got[0] != f.setsid.PID || len(withheld) != 0 {
		t.Fatalf("escaped %v withheld %v, want only the real child %d (bystander %d)", got, pids(withheld), f.setsid.PID, f.bystander.PID)
	}
}

// TestDescendantsOfARecycledMember: a member recorded at the scan whose
// PID now names another process (here: the fixture's member, recorded
// with an earlier start time) passes on no children, from the parent links
// or from the children files: they are the new holder's, not the tree's.
func TestDescendantsOfARecycledMember(t *testing.T) {
	f := startEscapeFixture(t)
	gone := f.member
	gone.StartTicks-- // the process the scan saw; its PID was handed on
	l := &proctable.Listing{
		PIDs:  []int{f.member.PID, f.setsid.PID},
		PGIDs: []int32{int32(f.member.PGID), int32(f.setsid.PGID)},
		PPIDs: []int32{int32(f.member.PPID), int32(f.member.PID)},
	}
	for _, tt := range []struct {
		name string
		l    *proctable.Listing
	}{{"parent links", l}, {"children files", nil}} {
		t.Run(tt.name, func(t *testing.T) {
			esc, withheld := Descendants(fingerprint.DefaultRoot, tt.l, []fingerprint.Identity{gone}, f.rules())
			if len(esc) != 0 || len(withheld) != 0 {
				t.Fatalf("escaped %v withheld %v under a recycled member; want none", pids(esc), pids(withheld))
			}
			// Control: the member as it really is.
			if esc, _ := Descendants(fingerprint.DefaultRoot, tt.l, []fingerprint.Identity{f.member}, f.rules()); len(esc) != 1 {
				t.Fatalf("control: escaped %v, want the setsid child", pids(esc))
			}
		})
	}
}

// TestDescendantsWithheld: a tree of another UID than the child's, or a
// child carrying another container's ID, gets it reported, never escaped.
func TestDescendantsWithheld(t *testing.T) {
	f := startEscapeFixture(t)
	r := f.rules()
	r.UID = f.member.UID + 1
	esc, withheld := Descendants(fingerprint.DefaultRoot, nil, []fingerprint.Identity{f.member}, r)
	if len(esc) != 0 || len(withheld) != 1 || withheld[0].PID != f.setsid.PID {
		t.Fatalf("another UID: escaped %v withheld %v", pids(esc), pids(withheld))
	}
	r = f.rules()
	r.UID = -1 // a tree of mixed UIDs vouches for none
	if esc, _ := Descendants(fingerprint.DefaultRoot, nil, []fingerprint.Identity{f.member}, r); len(esc) != 0 {
		t.Fatalf("mixed UIDs: escaped %v", pids(esc))
	}
}

// TestDescendantsUnreadableIsWithheld: a descendant whose argv cannot be
// read (here over the read cap; a process can make its own so) is
// reported, not taken for gone, and nothing below it is walked.
func TestDescendantsUnreadableIsWithheld(t *testing.T) {
	member := exec.Command("bash", "-c", `setsid sh -c 'sleep 1000000; :' $(head -c 1200000 /dev/zero | tr '\0' a | fold -w 120000) & wait`)
	member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	tproc.StartGroup(t, member)
	// Registered before the wait so that a failed wait still kills the
	// setsid child, which the member's group kill does not reach.
	t.Cleanup(func() {
		for _, c := range Children(fingerprint.DefaultRoot, member.Process.Pid) {
			if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, c); err == nil && st.PGID == c {
				syscall.Kill(-c, syscall.SIGKILL)
			}
		}
	})
	var big fingerprint.Stat
	tproc.WaitFor(t, 10*time.Second, "the member's setsid child and its sleep", func() bool {
		for _, c := range Children(fingerprint.DefaultRoot, member.Process.Pid) {
			if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, c); err == nil && st.PGID == c && st.Comm == "sh" && len(Children(fingerprint.DefaultRoot, c)) > 0 {
				big = st
				return true
			}
		}
		return false
	})
	if _, err := fingerprint.Read(fingerprint.DefaultRoot, big.PID); err == nil {
		t.Fatal("the child's argv reads: no case")
	}
	m, err := fingerprint.Read(fingerprint.DefaultRoot, member.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	r := Rules{InGroup: func(pgid int) bool { return pgid == m.PGID }, UID: m.UID, ContainerID: cidA}
	esc, withheld := Descendants(fingerprint.DefaultRoot, nil, []fingerprint.Identity{m}, r)
	if len(esc) != 0 || len(withheld) != 1 || withheld[0].PID != big.PID {
		t.Fatalf("escaped %v withheld %v; want only %d withheld", pids(esc), pids(withheld), big.PID)
	}
}

// TestTreeAboveTheCallerHoldsIt: a tree the calling process descends from
// (a janitor run in a terminal a kernel opened) holds the caller: the
// caller is withheld, and the tree refused as a whole.
func TestTreeAboveTheCallerHoldsIt(t *testing.T) {
	// The nearest ancestor outside the caller's group stands for the
	// kernel's terminal.
	parent := ancestorOutsideOurGroup(t)
	tr := Tree{PGID: parent.PGID, UID: parent.UID, ContainerID: cidA, Members: []fingerprint.Identity{parent}}
	addDescendants(fingerprint.DefaultRoot, &tr, nil)
	if !tr.HoldsCaller() {
		t.Fatalf("a tree above the caller does not hold it: escaped %v withheld %v", pids(tr.Escaped), pids(tr.Withheld))
	}
}

// TestTreeAboveAnotherUIDAboveTheCallerHoldsIt: the walk down from a tree
// stops at a process it withholds (another UID's: sudo or su between a
// kernel's terminal and a janitor run from it); the caller below it is
// still found held, from its own ancestry.
func TestTreeAboveAnotherUIDAboveTheCallerHoldsIt(t *testing.T) {
	parent := ancestorOutsideOurGroup(t)
	// A tree of another UID than the processes between it and the
	// caller: they are withheld, the walk goes no further.
	uid := 65534
	if parent.UID == uid {
		uid--
	}
	tr := Tree{PGID: parent.PGID, UID: uid, ContainerID: cidA, Members: []fingerprint.Identity{parent}}
	addDescendants(fingerprint.DefaultRoot, &tr, nil)
	if len(tr.Withheld) == 0 || slices.ContainsFunc(tr.Withheld, func(w fingerprint.Identity) bool { return w.PID == os.Getpid() }) {
		t.Skipf("no process withheld between the tree and the caller (withheld %v)", pids(tr.Withheld))
	}
	if !tr.HoldsCaller() {
		t.Fatalf("a tree above a withheld process above the caller does not hold it: withheld %v", pids(tr.Withheld))
	}
}

// TestCallerUnderACutWalk: where the walk down from a tree stops at its
// bound, the caller may lie below where it stopped, with the shells
// between among the escaped; the caller's own ancestry then says whether
// the tree holds it. A stranger's cut tree does not.
func TestCallerUnderACutWalk(t *testing.T) {
	parent, err := fingerprint.Read("/proc", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	above := Tree{PGID: parent.PID, UID: parent.UID, Members: []fingerprint.Identity{parent}}
	addDescendantsUpTo("/proc", &above, nil, 0)
	if !above.callerBelow {
		t.Errorf("a tree whose member is the caller's parent, its walk cut: not taken to hold the caller")
	}

	sh := exec.Command("sh", "-c", "sleep 1000000 & wait")
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
		sh.Wait()
	})
	var stranger fingerprint.Identity
	deadline := time.Now().Add(5 * time.Second)
	for {
		stranger, err = fingerprint.Read("/proc", sh.Process.Pid)
		if err == nil && len(Children("/proc", sh.Process.Pid)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stranger's child did not start: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	other := Tree{PGID: stranger.PID, UID: stranger.UID, Members: []fingerprint.Identity{stranger}}
	addDescendantsUpTo("/proc", &other, nil, 0)
	if other.callerBelow {
		t.Errorf("a stranger's tree, its walk cut, taken to hold the caller")
	}
}

// TestRulesMember: a process of the tree's cgroup or below it is the
// tree's only if it runs wholly as the tree's UID, is no monitor, and
// names no other container.
func TestRulesMember(t *testing.T) {
	const cidOther = "b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4"
	r := Rules{InGroup: func(int) bool { return false }, UID: 1000, ContainerID: cidA}
	as := func(uid, euid, suid int, comm string, argv ...string) fingerprint.Identity {
		return fingerprint.Identity{Stat: fingerprint.Stat{PID: 42, Comm: comm}, TGID: 42, UID: uid, EUID: euid, SUID: suid, Argv: argv}
	}
	tests := []struct {
		name string
		id   fingerprint.Identity
		want bool
	}{
		{"the tree's user's process", as(1000, 1000, 1000, "python3", "python3", "-m", "ipykernel"), true},
		{"one naming the tree's container", as(1000, 1000, 1000, "kcserver", "kcserver", "--container-id", cidA), true},
		{"another user's", as(1001, 1001, 1001, "python3"), false},
		{"a setuid program the user ran", as(1000, 0, 0, "sudo", "sudo", "ls"), false},
		{"one that kept root as its saved UID", as(1000, 1000, 0, "ping"), false},
		{"a monitor", as(1000, 1000, 1000, "conmon"), false},
		{"one naming another container", as(1000, 1000, 1000, "kcserver", "kcserver", "--container-id", cidOther), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Member(tt.id); got != tt.want {
				t.Errorf("Member(%+v) = %v, want %v", tt.id, got, tt.want)
			}
		})
	}
	if (Rules{UID: -1}).Member(as(0, 0, 0, "python3")) {
		t.Error("a tree of no known UID has members")
	}
}

// TestChildrenOfEveryThread: the children of all of a process's threads,
// each once, in PID order; a process that is gone has none.
func TestChildrenOfEveryThread(t *testing.T) {
	root := t.TempDir()
	for tid, kids := range map[string]string{"42": "7 5 ", "43": "5 9", "44": ""} {
		dir := filepath.Join(root, "42", "task", tid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "children"), []byte(kids), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := Children(root, 42); !slices.Equal(got, []int{5, 7, 9}) {
		t.Errorf("Children = %v, want [5 7 9]", got)
	}
	if got := Children(root, 43); got != nil {
		t.Errorf("Children of a gone process = %v, want none", got)
	}
}

// ancestorOutsideOurGroup is the test process's nearest ancestor outside
// its own process group (skipping the test where there is none but
// init).
func ancestorOutsideOurGroup(t *testing.T) fingerprint.Identity {
	t.Helper()
	self, err := fingerprint.Read(fingerprint.DefaultRoot, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	parent := self
	for parent.PGID == self.PGID {
		if parent.PPID <= 1 {
			t.Skip("no ancestor outside the test's own group but init")
		}
		if parent, err = fingerprint.Read(fingerprint.DefaultRoot, parent.PPID); err != nil {
			t.Fatal(err)
		}
	}
	return parent
}
