package sweep

import (
	"context"
	"fmt"
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
			if got := paths(byOwnerTurns(mk(strings.Fields(tc.in)...))); got != tc.want {
				t.Errorf("byOwnerTurns(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestHungSocketsOfOneUserDoNotStarveAnother: another user's sockets that
// never answer sort before root's orphan, and there are more of them
// than the workers can probe before the deadline. Root's orphan is still
// probed, and unlinked: owners take turns (in path order it came last and
// was reported not probed).
func TestHungSocketsOfOneUserDoNotStarveAnother(t *testing.T) {
	const n, first = 16, 1000000
	dir := worldDir(t)
	testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: first, UID: nobody})
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
}
