package reconcile

import (
	"strings"
	"testing"
)

// TestMembersText: a text report names a tree's first members and counts
// the rest, so a group of thousands (anyone can fork them) stays one
// short line; the JSON keeps them all.
func TestMembersText(t *testing.T) {
	tree := func(n int, escaped ...int) []Member {
		var ms []Member
		for i := range n {
			ms = append(ms, Member{PID: 100 + i, Comm: "kcserver"})
		}
		for _, i := range escaped {
			ms[i].Escaped = true
		}
		return ms
	}
	for _, tc := range []struct {
		name string
		ms   []Member
		want string
	}{
		{"one", tree(1), "kcserver(100)"},
		{"escaped shown", tree(2, 1), "kcserver(100) +kcserver(101)"},
		{"all shown", tree(ShownMembers), "kcserver(107)"},
		{"one more", tree(ShownMembers + 1), "(+1 more)"},
		{"thousands", tree(5000, 3, 4000, 4999), "(+4992 more, 2 escaped)"},
		{"a comm with a space is one word", []Member{{PID: 1, Comm: "a b"}}, `"a b"(1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MembersText(tc.ms, ShownMembers)
			if n := strings.Count(got, ")") - strings.Count(got, "more"); n != min(len(tc.ms), ShownMembers) {
				t.Errorf("%d members named, want %d: %s", n, min(len(tc.ms), ShownMembers), got)
			}
			if !strings.HasSuffix(got, tc.want) {
				t.Errorf("members = %q, want it to end in %q", got, tc.want)
			}
		})
	}
}
