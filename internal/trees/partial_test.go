package trees

import (
	"reflect"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestPartial checks that Options.Partial reads a group led by a live
// supervisor only through its leader, and that Complete then finds what
// a scan without it finds: the same members, and another container's ID
// on a member that the leader's argv does not show (Ambiguous).
func TestPartial(t *testing.T) {
	const comm = "kcsrv-partial"
	plainID, mixedID, otherID := testutil.RandomHex(t, 64), testutil.RandomHex(t, 64), testutil.RandomHex(t, 64)
	plain := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Comm: comm, ContainerID: plainID, Children: 1})
	// A member carries another container's ID: the group is ambiguous,
	// and only its members' argv say so.
	mixed := testutil.StartMixedGroup(t, comm, mixedID, otherID)

	scan := func(t *testing.T, opt Options) ([]Tree, Stats) {
		t.Helper()
		opt.Comms, opt.Lister = []string{comm}, proctable.ListBPF
		ts, st, err := Scan(opt)
		if err != nil {
			t.Fatal(err)
		}
		return ts, st
	}
	ours := func(ts []Tree) map[int]Tree {
		out := map[int]Tree{}
		for _, tr := range ts {
			if tr.PGID == plain.PGID || tr.PGID == mixed.PGID {
				out[tr.PGID] = tr
			}
		}
		return out
	}

	full, fullStats := scan(t, Options{})
	want := ours(full)
	if len(want) != 2 || !want[mixed.PGID].Ambiguous || want[plain.PGID].ContainerID != plainID {
		t.Fatalf("scan without Partial: %+v", want)
	}

	t.Run("read through the leader, completed to the full read", func(t *testing.T) {
		ts, stats := scan(t, Options{Partial: true})
		got := ours(ts)
		for _, c := range []struct {
			pgid int
			cid  string
		}{{plain.PGID, plainID}, {mixed.PGID, mixedID}} {
			p, ok := got[c.pgid]
			if !ok {
				t.Fatalf("group %d: no tree", c.pgid)
			}
			if !p.Partial || p.ContainerID != c.cid || p.Ambiguous || !p.Signalable() || !p.AgeKnown || p.UID != want[c.pgid].UID {
				t.Errorf("partial tree of group %d: %+v", c.pgid, p)
			}
			if g, w := memberKeys(p.Members), memberKeys(want[c.pgid].Members); !reflect.DeepEqual(g, w) {
				t.Errorf("group %d: partial members %v, want %v", c.pgid, g, w)
			}
			var cp Completer
			defer cp.Close()
			done, ok := cp.Complete(p)
			if !ok {
				t.Fatalf("group %d: Complete found no tree", c.pgid)
			}
			if done.Partial || !reflect.DeepEqual(summarise([]Tree{done}), summarise([]Tree{want[c.pgid]})) {
				t.Errorf("group %d completed:\n got %+v\nwant %+v", c.pgid, summarise([]Tree{done}), summarise([]Tree{want[c.pgid]}))
			}
			if g, w := memberKeys(done.Members), memberKeys(want[c.pgid].Members); !reflect.DeepEqual(g, w) {
				t.Errorf("group %d: completed members %v, want %v", c.pgid, g, w)
			}
		}
		if stats.FullReads >= fullStats.FullReads {
			t.Errorf("Partial read %d identities in full, no fewer than without it (%d)", stats.FullReads, fullStats.FullReads)
		}
	})

	t.Run("a member the ledger gives to another container is read", func(t *testing.T) {
		m := want[plain.PGID].Members[len(want[plain.PGID].Members)-1]
		known := map[Key]string{{PID: m.PID, StartTicks: m.StartTicks, PGID: plain.PGID}: otherID}
		ts, _ := scan(t, Options{Partial: true, Known: known})
		got, ok := ours(ts)[plain.PGID]
		if !ok || got.Partial || !got.Ambiguous {
			t.Errorf("tree of a group the ledger makes ambiguous: %+v", got)
		}
	})

	// The ledger's snapshot of a group: every member, given to id.
	knownAs := func(g Tree, id string) map[Key]string {
		out := map[Key]string{}
		for _, m := range g.Members {
			out[Key{PID: m.PID, StartTicks: m.StartTicks, PGID: g.PGID}] = id
		}
		return out
	}

	t.Run("a leader the ledger knows is taken without its argv", func(t *testing.T) {
		leaderArgv := func(tr Tree) []string {
			for _, m := range tr.Members {
				if m.PID == tr.PGID {
					return m.Argv
				}
			}
			t.Fatalf("tree %d has no leader", tr.PGID)
			return nil
		}
		ts, _ := scan(t, Options{Partial: true})
		if p := ours(ts)[plain.PGID]; leaderArgv(p) == nil {
			t.Fatalf("an unknown leader's argv was not read: %+v", p)
		}
		ts, _ = scan(t, Options{Partial: true, Known: knownAs(want[plain.PGID], plainID)})
		p, ok := ours(ts)[plain.PGID]
		if !ok || !p.Partial || p.ContainerID != plainID || p.Ambiguous || !p.Signalable() {
			t.Fatalf("partial tree of a known leader's group: %+v", p)
		}
		if argv := leaderArgv(p); argv != nil {
			t.Errorf("a known leader's argv was read: %q", argv)
		}
		var cp Completer
		defer cp.Close()
		done, ok := cp.Complete(p)
		if !ok || done.Partial || done.ContainerID != plainID || done.Ambiguous {
			t.Errorf("completed: %+v", done)
		}
	})

	t.Run("a leader the ledger gives to another container than its argv does is ambiguous once read", func(t *testing.T) {
		thirdID := testutil.RandomHex(t, 64)
		ts, _ := scan(t, Options{Partial: true, Known: knownAs(want[plain.PGID], thirdID)})
		p, ok := ours(ts)[plain.PGID]
		if !ok || !p.Partial || p.ContainerID != thirdID {
			t.Fatalf("partial tree: %+v", p)
		}
		var cp Completer
		defer cp.Close()
		done, ok := cp.Complete(p)
		if !ok || !done.Ambiguous || done.Signalable() {
			t.Errorf("completed tree of a leader whose argv and ledger disagree: %+v", done)
		}
	})

	t.Run("Only's filter reads no member the ledger gives to the tree's container", func(t *testing.T) {
		only := map[string]bool{testutil.RandomHex(t, 64): true}
		for _, c := range []struct {
			name   string
			known  map[Key]string
			reads  bool
			pgid   int
			leader string
		}{
			{"all known", knownAs(want[plain.PGID], plainID), false, plain.PGID, plainID},
			{"none known", nil, true, plain.PGID, plainID},
		} {
			ts, _ := scan(t, Options{Partial: true, Known: c.known, Only: only})
			p, ok := ours(ts)[c.pgid]
			if !ok || !p.Partial {
				t.Fatalf("%s: partial tree: %+v", c.name, p)
			}
			var cp Completer
			if done, ok := cp.Complete(p); ok {
				t.Errorf("%s: an unwanted tree was completed: %+v", c.name, done)
			}
			reads := 0
			for _, s := range cp.scanners {
				reads += s.stats.ArgvReads
			}
			cp.Close()
			if (reads > 0) != c.reads {
				t.Errorf("%s: Only's filter read %d argv, want reads: %v", c.name, reads, c.reads)
			}
		}
	})

	t.Run("not with the /proc lister", func(t *testing.T) {
		ts, _, err := Scan(Options{Comms: []string{comm}, Lister: proctable.ListProc, Partial: true})
		if err != nil {
			t.Fatal(err)
		}
		for pgid, tr := range ours(ts) {
			if tr.Partial {
				t.Errorf("group %d: partial from a /proc listing, which has no members' comm", pgid)
			}
		}
	})
}

// memberKey is what a partial tree knows of a member without its files.
type memberKey struct {
	PID, PGID, UID int
	StartTicks     uint64
	Comm           string
}

func memberKeys(ms []fingerprint.Identity) []memberKey {
	out := make([]memberKey, len(ms))
	for i, m := range ms {
		out[i] = memberKey{m.PID, m.PGID, m.UID, m.StartTicks, m.Comm}
	}
	return out
}
