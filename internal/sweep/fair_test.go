package sweep

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestByOwnerTurns(t *testing.T) {
	mk := func(specs ...string) []*probe {
		var ps []*probe
		for _, s := range specs {
			var uid int
			fmt.Sscanf(s[1:], "%d", &uid)
			ps = append(ps, &probe{names: []*Socket{{Path: s, e: &entry{uid: uid}}}})
		}
		return ps
	}
	paths := func(ps []*probe) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.names[0].Path)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct{ name, in, want string }{
		{"one owner keeps path order", "a1 b1 c1", "a1 b1 c1"},
		{"owners take turns", "a1 b1 c1 d2 e3 f3", "a1 d2 e3 b1 f3 c1"},
		{"an owner with one socket goes first round", "a7 b7 c7 d7 e0", "a7 e0 b7 c7 d7"},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := paths(byOwnerTurns(mk(strings.Fields(tc.in)...), func(uid int) int { return uid })); got != tc.want {
				t.Errorf("byOwnerTurns(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestReadSubIDs(t *testing.T) {
	f := filepath.Join(t.TempDir(), "subuid")
	content := "# comment\nroot:100000:65536\n1000:200000:10\nnosuchuser-kc:300000:10\nbroken\n1001:400000:0\n1002:x:1\n"
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	s := readSubIDs(f)
	for _, tc := range []struct{ uid, want int }{
		{100000, 0}, {165535, 0}, {165536, 165536}, {99999, 99999},
		{200009, 1000}, {200010, 200010}, {300000, 300000}, {400000, 400000}, {0, 0},
	} {
		if got := s.owner(tc.uid); got != tc.want {
			t.Errorf("owner(%d) = %d, want %d", tc.uid, got, tc.want)
		}
	}
	if readSubIDs(filepath.Join(t.TempDir(), "missing")).owner(100000) != 100000 {
		t.Error("a missing file delegates something")
	}
}

// TestHungSocketsOfOneUserDoNotStarveAnother: another user's sockets that
// never answer sort before root's orphan, and there are more of them
// than the workers can probe before the deadline. Root's orphan is still
// probed, and unlinked: owners take turns (in path order it came last and
// was reported not probed), and a user's subordinate UIDs (/etc/subuid)
// take his turn, not one each.
func TestHungSocketsOfOneUserDoNotStarveAnother(t *testing.T) {
	const n, first = 16, 1000000
	for _, tc := range []struct {
		name    string
		uid     func(i int) int
		subuids string
	}{
		{"one UID", func(int) int { return nobody }, ""},
		{"a UID each, all one user's subordinate UIDs", func(i int) int { return 300000 + i }, fmt.Sprintf("%d:300000:65536\n", nobody)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := worldDir(t)
			if tc.subuids == "" {
				testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: first, UID: tc.uid(0)})
			}
			for i := 0; tc.subuids != "" && i < n; i++ {
				testutil.StartSockServer(t, dir, testutil.SockServer{N: 1, First: first + i, UID: tc.uid(i)})
			}
			last := fmt.Sprintf("kc-%d.sock", first+n-1)
			var name string
			for range 100 {
				if name = fmt.Sprintf("kc-%d.sock", deadPID(t)); name > last {
					break
				}
			}
			if name <= last {
				t.Fatalf("no dead PID whose socket name sorts after %s", last)
			}
			orphan := orphanSocket(t, dir, name)

			cfg := fastConfig(dir)
			cfg.Apply = true
			cfg.Workers = 2
			cfg.Timeout = time.Second
			cfg.Deadline = 2 * time.Second // the hung sockets need 8 s
			cfg.subUIDFile = filepath.Join(t.TempDir(), "subuid")
			if err := os.WriteFile(cfg.subUIDFile, []byte(tc.subuids), 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Sweep(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Unprobed == 0 {
				t.Fatalf("every hung socket was probed within %v: the test proves nothing", cfg.Deadline)
			}
			i := slices.IndexFunc(rep.Sockets, func(s *Socket) bool { return s.Path == orphan })
			if i < 0 {
				t.Fatalf("orphan %s not in the report", orphan)
			}
			if s := rep.Sockets[i]; s.Verdict != VerdictStale || testutil.PathExists(orphan) {
				t.Errorf("orphan: %s, %s (%s); want stale and unlinked", s.Verdict, s.Action, s.Reason)
			}
		})
	}
}

// TestHungSocketsLeaveTimeForSessions: hung servers of one user that
// would fill the server rounds up to the deadline still leave time to
// dial the session sockets of the servers judged: a dead server's
// orphan session socket is unlinked with its control socket.
func TestHungSocketsLeaveTimeForSessions(t *testing.T) {
	const n, first = 16, 1000000
	dir := worldDir(t)
	testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: first, UID: nobody})
	pid := deadPID(t)
	control := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", pid))
	session := orphanSocket(t, dir, fmt.Sprintf("kc-%d.abcd1234.sock", pid))
	cfg := fastConfig(dir)
	cfg.Apply = true
	cfg.Workers = 2
	cfg.Timeout = time.Second
	cfg.Deadline = 2 * time.Second // the hung sockets need 8 s
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unprobed == 0 {
		t.Fatalf("every hung socket was probed within %v: the test proves nothing", cfg.Deadline)
	}
	for _, p := range []string{control, session} {
		i := slices.IndexFunc(rep.Sockets, func(s *Socket) bool { return s.Path == p })
		if i < 0 {
			t.Fatalf("%s not in the report", p)
		}
		if s := rep.Sockets[i]; s.Verdict != VerdictStale || testutil.PathExists(p) {
			t.Errorf("%s: %s, %s (%s); want stale and unlinked", p, s.Verdict, s.Action, s.Reason)
		}
	}
}

// TestListingSharesBySubordinateOwner: a rootless user's sockets, each
// of another of his subordinate UIDs, share one owner's part of a full
// listing; another user's socket, listed last, is kept (counted by UID,
// each of his would have had a part, and it none).
func TestListingSharesBySubordinateOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the sockets are given to other UIDs")
	}
	dir := shortTemp(t)
	for i := range 8 {
		orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", 100+i))
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	names, err := f.Readdirnames(-1) // in the order a listing reads them
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	other := names[len(names)-1]
	for i, n := range names {
		uid := 100000 + i
		if n == other {
			uid = 2000
		}
		if err := os.Lchown(filepath.Join(dir, n), uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	subuid := filepath.Join(t.TempDir(), "subuid")
	if err := os.WriteFile(subuid, []byte("1000:100000:65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(dir)
	cfg.subUIDFile, cfg.maxNames = subuid, 4
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[int]int{}
	for _, s := range rep.Sockets {
		byUID[s.UID]++
	}
	if byUID[2000] != 1 || len(rep.Sockets) != 4 {
		t.Errorf("sockets listed by UID %v, want uid 2000's among the 4 kept", byUID)
	}
}

// TestSocketsSharedAmongDirectories: one sweep holds at most its bound
// of sockets in all, shared among its directories: one with few keeps
// all of them, the full ones split the rest (a user who names
// directories of his own and fills them neither makes the sweep large
// nor crowds /tmp out).
func TestSocketsSharedAmongDirectories(t *testing.T) {
	few, full1, full2 := shortTemp(t), shortTemp(t), shortTemp(t)
	for i := range 2 {
		orphanSocket(t, few, fmt.Sprintf("kc-%d.sock", 100+i))
	}
	for _, d := range []string{full1, full2} {
		for i := range 12 {
			orphanSocket(t, d, fmt.Sprintf("kc-%d.sock", 200+i))
		}
	}
	cfg := fastConfig(full1, few, full2)
	cfg.maxNames = 10
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]int{}
	for _, s := range rep.Sockets {
		in[filepath.Dir(s.Path)]++
	}
	if len(rep.Sockets) > 10 || in[few] != 2 || in[full1] != 4 || in[full2] != 4 {
		t.Errorf("sockets kept by directory %v (%d in all); want the 2 of %s and 4 of each full one, 10 at most", in, len(rep.Sockets), few)
	}
	if len(rep.DirErrors) != 2 {
		t.Errorf("directory errors %v; want the two full ones' sockets left said", rep.DirErrors)
	}
}

// TestBudgetOwner: the answers of a user's subordinate UIDs count as his
// in the read budget, and a container's root apart from the host's (who
// is not bounded apart).
func TestBudgetOwner(t *testing.T) {
	subs := subIDs{{owner: 1000, start: 100000, count: 65536}}
	container := Target{InitPID: 4242}
	for _, tc := range []struct {
		name string
		t    Target
		uid  int
		want int
	}{
		{"a user", Target{}, 1000, 1000},
		{"one of his subordinate UIDs", Target{}, 100001, 1000},
		{"another of them", container, 165535, 1000},
		{"the host's root", Target{}, 0, 0},
		{"a container's root", container, 0, -4242},
	} {
		if got := budgetOwner(tc.t, subs.owner(tc.uid)); got != tc.want {
			t.Errorf("%s: budgetOwner = %d, want %d", tc.name, got, tc.want)
		}
	}
}
