package trees

import (
	"testing"
)

// TestReexamineKeepsUnchangedGroups: once /proc completed a listing the
// iterator's census could not vouch for, a group listed as before keeps
// its examination (no second read of its members); one whose members or
// leader changed is not taken as the same.
func TestReexamineKeepsUnchangedGroups(t *testing.T) {
	a := candidate{pgid: 10, pids: []int{10, 11}, starts: []uint64{5, 6}, leader: leaderMark{live: true, sup: true}, listed: true}
	b := candidate{pgid: 20, pids: []int{20}, starts: []uint64{7}, listed: true}
	ta, tb := &Tree{PGID: 10}, &Tree{PGID: 20}
	out := reexamine(nil, []candidate{a, b}, []*Tree{ta, tb}, []candidate{b, a})
	if len(out) != 2 || out[0] != tb || out[1] != ta {
		t.Fatalf("unchanged groups: %v, want their first examinations, in the new order", out)
	}
	for _, tc := range []struct {
		name   string
		change func(*candidate)
	}{
		{"a member added", func(c *candidate) { c.pids = append(c.pids, 12); c.starts = append(c.starts, 0) }},
		{"another leader", func(c *candidate) { c.leader = leaderMark{} }},
		{"another start", func(c *candidate) { c.starts = []uint64{5, 9} }},
		{"leader not listed", func(c *candidate) { c.listed = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := a
			c.pids, c.starts = append([]int{}, a.pids...), append([]uint64{}, a.starts...)
			tc.change(&c)
			if sameCandidate(a, c) {
				t.Errorf("%+v taken for %+v", c, a)
			}
		})
	}
}
