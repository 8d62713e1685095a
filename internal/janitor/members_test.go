package janitor

import (
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// TestMembersText: a text report names a tree's first members and counts
// the rest, so a group of thousands (anyone can fork them) stays one
// short line; the JSON keeps them all.
func TestMembersText(t *testing.T) {
	tree := func(n int, escaped ...int) []reconcile.Member {
		var ms []reconcile.Member
		for i := range n {
			ms = append(ms, reconcile.Member{PID: 100 + i, Comm: "kcserver"})
		}
		for _, i := range escaped {
			ms[i].Escaped = true
		}
		return ms
	}
	for _, tc := range []struct {
		name string
		ms   []reconcile.Member
		want string
	}{
		{"one", tree(1), "kcserver(100)"},
		{"escaped shown", tree(2, 1), "kcserver(100) +kcserver(101)"},
		{"all shown", tree(shownMembers), "kcserver(107)"},
		{"one more", tree(shownMembers + 1), "(+1 more)"},
		{"thousands", tree(5000, 3, 4000, 4999), "(+4992 more, 2 escaped)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := members(tc.ms)
			if n := strings.Count(got, "kcserver("); n != min(len(tc.ms), shownMembers) {
				t.Errorf("%d members named, want %d: %s", n, min(len(tc.ms), shownMembers), got)
			}
			if !strings.HasSuffix(got, tc.want) {
				t.Errorf("members = %q, want it to end in %q", got, tc.want)
			}
		})
	}
}
