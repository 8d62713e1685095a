package reconcile

import (
	"fmt"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/printable"
)

// ShownMembers is how many of a tree's processes a report names: a user
// can put thousands in one group, and the JSON lists them all.
const ShownMembers = 8

// MembersText renders a tree's processes as "comm(pid) comm(pid)", the
// first max of them (all when max is 0), then how many more and how many
// of those escaped. An escaped member (outside the group) is marked with
// a '+', so a reader sees why a killpg alone would not have sufficed.
func MembersText(ms []Member, max int) string {
	if max <= 0 || max > len(ms) {
		max = len(ms)
	}
	out := make([]string, 0, max+1)
	for _, m := range ms[:max] {
		mark := ""
		if m.Escaped {
			mark = "+"
		}
		out = append(out, fmt.Sprintf("%s%s(%d)", mark, printable.Word(m.Comm), m.PID))
	}
	if rest := ms[max:]; len(rest) > 0 {
		escaped := 0
		for _, m := range rest {
			if m.Escaped {
				escaped++
			}
		}
		more := fmt.Sprintf("(+%d more", len(rest))
		if escaped > 0 {
			more += fmt.Sprintf(", %d escaped", escaped)
		}
		out = append(out, more+")")
	}
	return strings.Join(out, " ")
}
