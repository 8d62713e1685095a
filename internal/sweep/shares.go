package sweep

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// shares keeps at most max names and shares them among their owners
// max-min fairly. When it is full, a newcomer's name displaces the last
// kept name of an owner with the most, if that owner has at least two
// more than the newcomer's; otherwise it is left. So no owner's names
// crowd out another's: an owner loses names only while he has at least
// as many as anyone but one, and once every name was offered, each owner
// keeps all of his or at least max/owners rounded down. Which owner with
// the most gives one up follows from the order names came in alone (no
// map order), so the same listing keeps the same names every time.
type shares struct {
	max     int
	kept    int
	byOwner map[int][]string
	counts  map[int][]int // a count: the owners who have that many
	at      map[int]int   // an owner: his index in counts[his count]
	top     int           // the most any owner has
	left    int           // names not kept, offered or displaced
	losers  []int         // the first few owners who lost names
}

// maxLosers bounds the owners an error names.
const maxLosers = 8

func newShares(max int) *shares {
	return &shares{max: max, byOwner: map[int][]string{}, counts: map[int][]int{}, at: map[int]int{}}
}

// offer keeps name of uid, or leaves it or another.
func (s *shares) offer(uid int, name string) {
	have := len(s.byOwner[uid])
	if s.kept == s.max {
		if have+2 > s.top {
			s.lose(uid)
			return
		}
		richest := s.counts[s.top]
		rich := richest[len(richest)-1]
		names := s.byOwner[rich]
		s.byOwner[rich] = names[:len(names)-1]
		s.move(rich, len(names), len(names)-1)
		s.kept--
		s.lose(rich)
	}
	s.byOwner[uid] = append(s.byOwner[uid], name)
	s.move(uid, have, have+1)
	s.kept++
}

// move files uid under its new count, which differs by one.
func (s *shares) move(uid, from, to int) {
	if from > 0 {
		// Out of counts[from] by moving its last owner into uid's place.
		owners, i := s.counts[from], s.at[uid]
		last := owners[len(owners)-1]
		owners[i], s.at[last] = last, i
		s.counts[from] = owners[:len(owners)-1]
		if len(s.counts[from]) == 0 {
			delete(s.counts, from)
			if from == s.top {
				s.top--
			}
		}
	}
	if to > 0 {
		s.at[uid] = len(s.counts[to])
		s.counts[to] = append(s.counts[to], uid)
	}
	s.top = max(s.top, to)
}

func (s *shares) lose(uid int) {
	s.left++
	if len(s.losers) < maxLosers && !slices.Contains(s.losers, uid) {
		s.losers = append(s.losers, uid)
	}
}

// names are the names kept, in no order.
func (s *shares) names() []string {
	out := make([]string, 0, s.kept)
	for _, ns := range s.byOwner {
		out = append(out, ns...)
	}
	return out
}

// err says what was left, or nil.
func (s *shares) err() error {
	if s.left == 0 {
		return nil
	}
	uids := make([]string, len(s.losers))
	for i, u := range s.losers {
		uids[i] = strconv.Itoa(u)
	}
	more := ""
	if len(s.losers) == maxLosers {
		more = ", …"
	}
	return fmt.Errorf("more than %d entries to read: %d left, of the owners with the most (uid %s%s)", s.max, s.left, strings.Join(uids, ", "), more)
}
