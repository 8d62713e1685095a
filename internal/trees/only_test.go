package trees

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// TestScanOnly checks that Options.Only changes what a scan reads, never
// what it decides about the wanted containers: the trees it returns that
// carry a wanted ID are exactly those a scan without Only returns.
func TestScanOnly(t *testing.T) {
	const cidC = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	procs := []proc{
		// A's tree, led by its supervisor.
		{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", "--container-id=" + cidA}},
		{pid: 101, pgid: 100, comm: "python3", start: 90000, argv: []string{"python3"}},
		// B's tree: not wanted, and never read in full.
		{pid: 200, pgid: 200, comm: "kcserver", start: 90000, argv: []string{"kcserver", "--container-id=" + cidB}},
		{pid: 201, pgid: 200, comm: "python3", start: 90000, argv: []string{"python3"}},
		{pid: 202, pgid: 200, comm: "python3", start: 90000, argv: []string{"python3"}},
		// A group carrying both: ambiguous, and kept because it carries A.
		{pid: 300, pgid: 300, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
		{pid: 301, pgid: 300, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidB}},
		// A's kernels whose kcserver crashed: only the ledger ties them
		// to A (and the leader is gone).
		{pid: 401, pgid: 400, comm: "kcserver", start: 90000, argv: []string{"kcserver"}},
		{pid: 402, pgid: 400, comm: "python3", start: 90000, argv: []string{"python3"}},
		// C's tree, with the anchor not the leader.
		{pid: 500, pgid: 500, comm: "kcserver", start: 90000, argv: []string{"kcserver"}},
		{pid: 501, pgid: 500, comm: "sh", start: 90000, argv: []string{"sh", "-c", "x", cidC}},
	}
	known := map[Key]string{{PID: 402, StartTicks: 90000, PGID: 400}: cidA}

	for _, tt := range []struct {
		name string
		only map[string]bool
	}{
		{"one container", map[string]bool{cidA: true}},
		{"the other", map[string]bool{cidB: true}},
		{"an anchor that is not the leader", map[string]bool{cidC: true}},
		{"two", map[string]bool{cidB: true, cidC: true}},
		{"none on the host", map[string]bool{"dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd": true}},
	} {
		for _, full := range []bool{false, true} {
			for _, p := range pipelines {
				if full && p != (proctable.Pipeline{}) {
					continue
				}
				t.Run(fmt.Sprintf("%s/full=%v/%+v", tt.name, full, p), func(t *testing.T) {
					root := writeFixture(t, withFiller(procs))
					opt := Options{Root: root, Comms: []string{"kcserver"}, Known: known, Full: full, pipeline: p}
					all, allStats, err := Scan(opt)
					if err != nil {
						t.Fatal(err)
					}
					var want []Tree
					for _, tr := range all {
						if slices.ContainsFunc(tr.ContainerIDs, func(id string) bool { return tt.only[id] }) {
							want = append(want, tr)
						}
					}
					opt.Only = tt.only
					got, stats, err := Scan(opt)
					if err != nil {
						t.Fatal(err)
					}
					var gotWanted []Tree
					for _, tr := range got {
						if slices.ContainsFunc(tr.ContainerIDs, func(id string) bool { return tt.only[id] }) {
							gotWanted = append(gotWanted, tr)
						}
					}
					if g, w := summarise(gotWanted), summarise(want); !reflect.DeepEqual(g, w) {
						t.Errorf("with Only:\n got %+v\nwant %+v", g, w)
					}
					if stats.ArgvReads == 0 {
						t.Errorf("Only read no argv (stats %+v)", stats)
					}
					if stats.FullReads >= allStats.FullReads {
						t.Errorf("Only read %d identities in full, no fewer than without it (%d)", stats.FullReads, allStats.FullReads)
					}
				})
			}
		}
	}
}

// TestExamineConfirmsAnUnlistedLeader: a group whose leader the listing
// did not show is leaderless only if /proc agrees. The kernel's task
// iterator has been seen to omit a live process (PID 1 on this project's
// VMs); taken at its word, it would turn a foreign group into a tree.
func TestExamineConfirmsAnUnlistedLeader(t *testing.T) {
	member := proc{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}}
	for _, tt := range []struct {
		name   string
		leader *proc
		want   bool // a tree
	}{
		{"live foreign leader", &proc{pid: 100, pgid: 100, comm: "bash", start: 90000, argv: []string{"bash"}}, false},
		{"unreadable leader", &proc{pid: 100, pgid: 100, comm: "bash", start: 90000, garbled: true}, false},
		{"live supervisor leader", &proc{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver"}}, true},
		{"zombie leader", &proc{pid: 100, pgid: 100, comm: "bash", state: 'Z', start: 90000}, true},
		{"leader gone", nil, true},
	} {
		for _, fast := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fast=%v", tt.name, fast), func(t *testing.T) {
				procs := []proc{member}
				if tt.leader != nil {
					procs = append(procs, *tt.leader)
				}
				root := writeFixture(t, procs)
				s := &scanner{opt: Options{Root: root, Comms: []string{"kcserver"}}, comms: map[string]bool{"kcserver": true, WrapperComm: true}}
				if fast {
					s.proc = proctable.NewReader(root)
					defer s.proc.Close()
				}
				_, got := s.examine(candidate{pgid: 100, pids: []int{101}})
				if got != tt.want {
					t.Errorf("examine of group 100 without its leader listed: tree = %v, want %v", got, tt.want)
				}
			})
		}
	}
}

// TestIdentitySince: given the start time a listing saw, the reader's
// three-read identity is fingerprint.Read's for that process, and a
// process started at any other time (the PID reused) reads as gone.
func TestIdentitySince(t *testing.T) {
	r := proctable.NewReader(fingerprint.DefaultRoot)
	defer r.Close()
	self := os.Getpid()
	want, err := fingerprint.Read(fingerprint.DefaultRoot, self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.IdentitySince(self, want.StartTicks)
	if err != nil {
		t.Fatalf("identitySince(self, its start): %v", err)
	}
	// Threads and state (R while it reads, S otherwise) may change
	// between the two reads; the rest may not.
	got.Threads, want.Threads = 0, 0
	got.State, want.State = 0, 0
	if !reflect.DeepEqual(got, want) {
		t.Errorf("identitySince = %+v, want %+v", got, want)
	}
	for _, start := range []uint64{want.StartTicks - 1, want.StartTicks + 1} {
		if _, err := r.IdentitySince(self, start); !errors.Is(err, fingerprint.ErrNotFound) {
			t.Errorf("identitySince(self, %d) with the start at %d: err %v, want ErrNotFound", start, want.StartTicks, err)
		}
	}
}

// TestScanByLeader: with ByLeader, a group another container's
// supervisor leads is that container's after its leader's cmdline alone,
// even with a member carrying a wanted ID (ambiguous, never signalled);
// a group the ledger ties to a wanted container, or whose leader names
// none, is read as without it.
func TestScanByLeader(t *testing.T) {
	procs := []proc{
		// B's supervisor leads; a member carries A.
		{pid: 300, pgid: 300, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidB}},
		{pid: 301, pgid: 300, comm: "python3", start: 90000, argv: []string{"python3", cidA}},
		{pid: 302, pgid: 300, comm: "python3", start: 90000, argv: []string{"python3"}},
		// B's supervisor leads; the ledger gives a member to A.
		{pid: 400, pgid: 400, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidB}},
		{pid: 401, pgid: 400, comm: "python3", start: 90000, argv: []string{"python3"}},
		// A's tree, its anchor not the leader.
		{pid: 500, pgid: 500, comm: "kcserver", start: 90000, argv: []string{"kcserver"}},
		{pid: 501, pgid: 500, comm: "sh", start: 90000, argv: []string{"sh", "-c", "x", cidA}},
	}
	known := map[Key]string{{PID: 401, StartTicks: 90000, PGID: 400}: cidA}
	root := writeFixture(t, procs)
	reads := map[bool]int{}
	for _, tc := range []struct {
		byLeader  bool
		want      []int // PGIDs of the trees returned
		othersLed []int
	}{
		{false, []int{300, 400, 500}, nil},
		{true, []int{400, 500}, []int{300}},
	} {
		t.Run(fmt.Sprintf("ByLeader=%v", tc.byLeader), func(t *testing.T) {
			got, stats, err := Scan(Options{Root: root, Comms: []string{"kcserver"}, Known: known, Only: map[string]bool{cidA: true}, ByLeader: tc.byLeader})
			if err != nil {
				t.Fatal(err)
			}
			reads[tc.byLeader] = stats.ArgvReads
			if !slices.Equal(stats.OthersLed, tc.othersLed) {
				t.Errorf("OthersLed %v, want %v", stats.OthersLed, tc.othersLed)
			}
			var pgids []int
			for _, tr := range got {
				pgids = append(pgids, tr.PGID)
				if tr.PGID == 400 && !tr.Ambiguous {
					t.Errorf("group 400 (B's leader, a member the ledger gives to A): %+v, want ambiguous", tr)
				}
			}
			if !slices.Equal(pgids, tc.want) {
				t.Errorf("trees %v, want %v", pgids, tc.want)
			}
		})
	}
	if reads[true] >= reads[false] {
		t.Errorf("%d cmdline reads with ByLeader, %d without: group 300 was read past its leader", reads[true], reads[false])
	}
}
