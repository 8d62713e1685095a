package trees

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

const (
	cidA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	cidB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// summary is what the decision tests compare.
type summary struct {
	PGID      int
	Container string
	Ambiguous bool
	Foreign   bool
	ByLedger  bool
	UID       int
	Members   []int
}

func summarise(ts []Tree) []summary {
	var out []summary
	for _, t := range ts {
		s := summary{PGID: t.PGID, Container: t.ContainerID, Ambiguous: t.Ambiguous, Foreign: t.Foreign, ByLedger: t.ByLedger, UID: t.UID}
		for _, m := range t.Members {
			s.Members = append(s.Members, m.PID)
		}
		slices.Sort(s.Members)
		out = append(out, s)
	}
	return out
}

func TestScanDecisions(t *testing.T) {
	// Start ticks: 90000 ticks = 900s after boot; uptime is 1000s.
	tests := []struct {
		name  string
		procs []proc
		known map[Key]string
		full  bool
		want  []summary
	}{
		{
			name: "kcserver leader with container id and kernels",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", "--container-id=" + cidA}},
				{pid: 101, pgid: 100, comm: "python3", start: 90100, argv: []string{"python3", "-m", "ipykernel"}},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 0, Members: []int{100, 101}}},
		},
		{
			name: "wrapper kc-hook always counts as a supervisor",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kc-hook", start: 90000, argv: []string{"kc-hook", "--state-dir=/run/kc", "supervise", "--max-restarts=3", cidA, "1", "2", "--", "x"}},
				{pid: 101, pgid: 100, comm: "x", start: 90000},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 0, Members: []int{100, 101}}},
		},
		{
			name: "kc-hook running a stage is not a supervisor, even beside an anchor",
			procs: []proc{
				// conmon's group after conmon exited: podman's cleanup
				// (carrying the ID) and the poststop hook it runs.
				{pid: 101, pgid: 100, comm: "podman", start: 90000, argv: []string{"podman", "container", "cleanup", cidA}},
				{pid: 102, pgid: 100, comm: "kc-hook", start: 90000, argv: []string{"kc-hook", "poststop"}},
			},
		},
		{
			name: "supervise after -- is the wrapped command's, not the wrapper's",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kc-hook", start: 90000, argv: []string{"kc-hook", "--", "supervise", cidA}},
			},
		},
		{
			name: "supervisor without container id is not ours",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver"}},
			},
		},
		{
			name: "conmon is an anchor but never a supervisor",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "conmon", start: 90000, argv: []string{"conmon", "-c", cidA, "-u", cidA}},
			},
		},
		{
			name: "container id embedded in a shell string is not a token",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", "-c", "run " + cidA}},
			},
		},
		{
			name: "two container ids make the tree ambiguous",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidB}},
			},
			want: []summary{{PGID: 100, Ambiguous: true, UID: 0, Members: []int{100, 101}}},
		},
		{
			name: "leader dead: group found through its supervisor member",
			procs: []proc{
				{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 102, pgid: 100, comm: "sleep", start: 90000, argv: []string{"sleep", "1"}},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 0, Members: []int{101, 102}}},
		},
		{
			name: "zombie leader counts as dead, zombie members are not members",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "bash", state: 'Z', start: 90000},
				{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 102, pgid: 100, comm: "kcserver", state: 'Z', start: 90000},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 0, Members: []int{101}}},
		},
		{
			name: "kernels of a crashed kcserver: attributed only by exact ledger identity",
			procs: []proc{
				{pid: 101, pgid: 100, comm: "python3", start: 90100},
				{pid: 102, pgid: 100, comm: "python3", start: 90200},
			},
			known: map[Key]string{{PID: 101, StartTicks: 90100, PGID: 100}: cidA},
			want:  []summary{{PGID: 100, Container: cidA, ByLedger: true, UID: 0, Members: []int{101, 102}}},
		},
		{
			name: "ledger identity with another start time does not attribute",
			procs: []proc{
				{pid: 101, pgid: 100, comm: "python3", start: 90101},
			},
			known: map[Key]string{{PID: 101, StartTicks: 90100, PGID: 100}: cidA},
		},
		{
			name: "ledger identity in another group does not attribute",
			procs: []proc{
				{pid: 101, pgid: 101, comm: "python3", start: 90100},
			},
			known: map[Key]string{{PID: 101, StartTicks: 90100, PGID: 100}: cidA},
		},
		{
			name: "mixed uids",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", uid: 1000, start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 101, pgid: 100, comm: "sleep", uid: 0, start: 90000},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: -1, Members: []int{100, 101}}},
		},
		{
			// Left out of the members, its argv unread (its memory
			// stalled), it is still in the group a kill reaches: its
			// UID, from its status, counts.
			name: "mixed uids, one member's argv unreadable",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", uid: 1000, start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 101, pgid: 100, comm: "sleep", uid: 0, start: 90000, unreadableArgv: true},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: -1, Members: []int{100}}},
		},
		{
			name: "one uid, one member's argv unreadable",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", uid: 1000, start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 101, pgid: 100, comm: "sleep", uid: 1000, start: 90000, unreadableArgv: true},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 1000, Members: []int{100}}},
		},
		{
			name: "foreign group: invisible to the fast scan",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "bash", start: 90000, argv: []string{"bash"}},
				{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
			},
		},
		{
			name: "foreign group: reported by the full scan, never signalable",
			full: true,
			procs: []proc{
				{pid: 100, pgid: 100, comm: "bash", start: 90000, argv: []string{"bash"}},
				{pid: 101, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
			},
			want: []summary{{PGID: 100, Container: cidA, Foreign: true, UID: 0, Members: []int{100, 101}}},
		},
		{
			name: "unreadable leader: the fast scan never offers its group",
			procs: []proc{
				{pid: 500, pgid: 500, comm: "bash", start: 90000, argv: []string{"bash"}, garbled: true},
				{pid: 501, pgid: 500, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
			},
		},
		{
			name: "unreadable leader: the full scan reports its group as foreign",
			full: true,
			procs: []proc{
				{pid: 500, pgid: 500, comm: "bash", start: 90000, argv: []string{"bash"}, garbled: true},
				{pid: 501, pgid: 500, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
			},
			want: []summary{{PGID: 500, Container: cidA, Foreign: true, UID: 0, Members: []int{501}}},
		},
		{
			// Spread over batches in every position: a leader the fast
			// scan failed to decide would make its group signalable.
			name:  "many foreign groups: none visible to the fast scan",
			procs: foreignGroups(12),
		},
		{
			name: "thread id listed as if it were a process is not a member",
			procs: []proc{
				{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
				{pid: 105, pgid: 100, comm: "tokio-runtime-w", start: 90000, tgid: 100},
			},
			want: []summary{{PGID: 100, Container: cidA, UID: 0, Members: []int{100}}},
		},
	}
	for _, tt := range tests {
		for _, p := range pipelines {
			if tt.full && p != (proctable.Pipeline{}) {
				continue // the full scan has no pipeline
			}
			t.Run(fmt.Sprintf("%s/%+v", tt.name, p), func(t *testing.T) {
				root := writeFixture(t, withFiller(tt.procs))
				got, _, err := Scan(Options{Root: root, Comms: []string{"kcserver"}, Known: tt.known, Full: tt.full, pipeline: p})
				if err != nil {
					t.Fatal(err)
				}
				if s := summarise(got); !reflect.DeepEqual(s, tt.want) {
					t.Errorf("Scan:\n got %+v\nwant %+v", s, tt.want)
				}
			})
		}
	}
}

// foreignGroups makes n groups each led by a shell that started a
// kcserver carrying a container ID.
func foreignGroups(n int) []proc {
	var out []proc
	for i := range n {
		pgid := 500 + 10*i
		out = append(out,
			proc{pid: pgid, pgid: pgid, comm: "bash", start: 90000, argv: []string{"bash"}},
			proc{pid: pgid + 1, pgid: pgid, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}})
	}
	return out
}

// pipelines are the fast scan's default split and two that force many
// batches and several goroutines onto a small process table.
var pipelines = []proctable.Pipeline{
	{},
	{BatchBytes: 128, MinPIDsPerWorker: 1, Workers: 4},
	{BatchBytes: 512, MinPIDsPerWorker: 8, Workers: 2},
}

// withFiller adds processes that no decision should care about, so that a
// small batch size spreads a fixture over several batches: lone shells and
// a group of sleeps whose leader is gone.
func withFiller(procs []proc) []proc {
	out := slices.Clone(procs)
	for pid := 2000; pid < 2040; pid++ {
		out = append(out, proc{pid: pid, pgid: pid, comm: "sh", start: 80000, argv: []string{"sh"}})
	}
	for pid := 3001; pid < 3010; pid++ {
		out = append(out, proc{pid: pid, pgid: 3000, comm: "sleep", start: 80000, argv: []string{"sleep", "1d"}})
	}
	return out
}

// TestScanAge: a tree is as young as its youngest member that dates it
// (its leader, a member naming its container by argv or the ledger); a
// child naming none, as a kernel's short-lived ones, does not make a
// gone container's tree young. The oldest member's age is every
// member's.
func TestScanAge(t *testing.T) {
	leader := proc{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}}
	recorded := map[Key]string{{PID: 101, StartTicks: 95000, PGID: 100}: cidA}
	for _, tc := range []struct {
		name  string
		procs []proc
		known map[Key]string
		want  time.Duration // uptime 1000s: a start at 950s is 50s old
	}{
		{"a child naming no container", []proc{leader,
			{pid: 101, pgid: 100, comm: "sleep", start: 95000, argv: []string{"sleep", "1"}}}, nil, 100 * time.Second},
		{"a member naming the container", []proc{leader,
			{pid: 101, pgid: 100, comm: "python", start: 95000, argv: []string{"python", "--container=" + cidA}}}, nil, 50 * time.Second},
		{"a member the ledger recorded", []proc{leader,
			{pid: 101, pgid: 100, comm: "sleep", start: 95000, argv: []string{"sleep", "1"}}}, recorded, 50 * time.Second},
		{"a leader naming none", []proc{
			{pid: 100, pgid: 100, comm: "kcserver", start: 95000, argv: []string{"kcserver"}},
			{pid: 101, pgid: 100, comm: "python", start: 90000, argv: []string{"python", cidA}}}, nil, 50 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := Scan(Options{Root: writeFixture(t, tc.procs), Comms: []string{"kcserver"}, Known: tc.known})
			if err != nil || len(got) != 1 {
				t.Fatalf("Scan = %v, %v", got, err)
			}
			if !got[0].AgeKnown || got[0].Age != tc.want || got[0].Oldest != 100*time.Second {
				t.Errorf("age %v, oldest %v (known %v), want %v and 100s", got[0].Age, got[0].Oldest, got[0].AgeKnown, tc.want)
			}
		})
	}
}

func TestSignalable(t *testing.T) {
	tests := []struct {
		name string
		tree Tree
		want bool
	}{
		{"plain", Tree{ContainerID: cidA, Members: make([]fingerprint.Identity, 1)}, true},
		{"ambiguous", Tree{Ambiguous: true, Members: make([]fingerprint.Identity, 1)}, false},
		{"foreign", Tree{ContainerID: cidA, Foreign: true, Members: make([]fingerprint.Identity, 1)}, false},
		{"no members", Tree{ContainerID: cidA}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.tree.Signalable(); got != tt.want {
				t.Errorf("Signalable = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLeaderMark checks what one stat read of a group leader decides, with
// both readers: a leader that cannot be read for another reason than being
// gone must count as a live leader outside the supervisor set, so that its
// group is never signalled.
func TestLeaderMark(t *testing.T) {
	root := writeFixture(t, []proc{
		{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
		{pid: 200, pgid: 200, comm: "bash", start: 90000, argv: []string{"bash"}},
		{pid: 300, pgid: 300, comm: "bash", start: 90000, garbled: true},
		{pid: 400, pgid: 400, comm: "kcserver", state: 'Z', start: 90000},
		{pid: 500, pgid: 1, comm: "kcserver", start: 90000},
	})
	tests := []struct {
		name string
		pid  int
		want leaderMark
	}{
		{"live supervisor", 100, leaderMark{live: true, sup: true}},
		{"live foreign leader", 200, leaderMark{live: true}},
		{"unreadable: taken for a live foreign leader", 300, unreadableLeader},
		{"zombie", 400, leaderMark{}},
		{"moved to another group", 500, leaderMark{}},
		{"gone", 600, leaderMark{}},
	}
	for _, fast := range []bool{true, false} {
		s := &scanner{opt: Options{Root: root, Comms: []string{"kcserver"}}, comms: map[string]bool{"kcserver": true, WrapperComm: true}}
		if fast {
			s.proc = proctable.NewReader(root)
			defer s.proc.Close()
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/fast=%v", tt.name, fast), func(t *testing.T) {
				if got := s.leader(tt.pid); got != tt.want {
					t.Errorf("leader(%d) = %+v, want %+v", tt.pid, got, tt.want)
				}
			})
		}
	}
}

func TestStalledNote(t *testing.T) {
	for _, tc := range []struct {
		pids []int
		want string
	}{
		{[]int{42}, "1: 42"},
		{[]int{1, 2, 3, 4, 5, 6, 7, 8}, "8: 1 2 3 4 5 6 7 8"},
		{[]int{1, 2, 3, 4, 5, 6, 7, 8, 9}, "9: 1 2 3 4 5 6 7 8 …"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := (Stats{Stalled: tc.pids}).StalledNote(); got != tc.want {
				t.Errorf("StalledNote() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStatusUID: the UID of a member whose argv could not be read comes
// from its status; one gone by then, or another process than the one
// listed, says nothing (it must not make the tree's UID unknown), and a
// status that cannot be read makes it unknown, as does a setuid program
// (its real UID the tree's, its effective one root's).
func TestStatusUID(t *testing.T) {
	root := writeFixture(t, []proc{
		{pid: 101, pgid: 100, comm: "sleep", uid: 1000, start: 90000},
		{pid: 102, pgid: 100, comm: "sleep", uid: 1000, start: 90000},
		{pid: 104, pgid: 100, comm: "sudo", uid: 1000, start: 90000},
	})
	if err := os.WriteFile(filepath.Join(root, "102", "status"), []byte("garbled\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "104", "status"), []byte("Name:\tsudo\nTgid:\t104\nPid:\t104\nUid:\t1000\t0\t0\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &scanner{opt: Options{Root: root}}
	for _, tc := range []struct {
		name   string
		pid    int
		listed uint64
		uid    int
		here   bool
	}{
		{"read", 101, 90000, 1000, true},
		{"start unknown", 101, 0, 1000, true},
		{"another process under the PID", 101, 80000, -1, false},
		{"gone", 103, 90000, -1, false},
		{"status unreadable", 102, 90000, -1, true},
		{"a setuid program", 104, 90000, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if uid, here := s.statusUID(tc.pid, tc.listed); uid != tc.uid || here != tc.here {
				t.Errorf("statusUID(%d, %d) = %d, %v; want %d, %v", tc.pid, tc.listed, uid, here, tc.uid, tc.here)
			}
		})
	}
}
