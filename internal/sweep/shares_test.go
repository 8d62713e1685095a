package sweep

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSharesAreMaxMinFair: whatever the order names come in, the names
// kept fill the cap, each once and as its owner's, and an owner who lost
// any keeps within one of the most anyone keeps: no owner is crowded out
// by another's many. The same offers keep the same names.
func TestSharesAreMaxMinFair(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int
		counts []int // names per owner
	}{
		{"under the cap", 10, []int{3, 4}},
		{"one owner floods", 10, []int{1, 1000}},
		{"many owners with one each", 10, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{"uneven", 100, []int{5, 80, 80, 30, 2, 200}},
		{"many flooders", 64, []int{40, 40, 40, 40, 40, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(20) {
				var offers []int
				for uid, n := range tc.counts {
					for range n {
						offers = append(offers, uid)
					}
				}
				r := rand.New(rand.NewPCG(seed, 1))
				r.Shuffle(len(offers), func(i, j int) { offers[i], offers[j] = offers[j], offers[i] })
				s := newShares(tc.max)
				owner := map[string]int{}
				for i, uid := range offers {
					name := fmt.Sprintf("kc-%d.sock", i)
					owner[name] = uid
					s.offer(uid, name)
				}
				total := len(offers)
				names := s.names()
				if got, want := len(names), min(total, tc.max); got != want {
					t.Fatalf("seed %d: kept %d names, want %d", seed, got, want)
				}
				seen := map[string]bool{}
				for _, n := range names {
					if seen[n] {
						t.Fatalf("seed %d: %s kept twice", seed, n)
					}
					seen[n] = true
				}
				for uid, kept := range s.byOwner {
					for _, n := range kept {
						if owner[n] != uid {
							t.Fatalf("seed %d: %s counted as uid %d's, offered as uid %d's", seed, n, uid, owner[n])
						}
					}
				}
				again := newShares(tc.max)
				for i, uid := range offers {
					again.offer(uid, fmt.Sprintf("kc-%d.sock", i))
				}
				if a, b := slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(again.names())); !slices.Equal(a, b) {
					t.Errorf("seed %d: the same offers kept other names", seed)
				}
				if (s.err() != nil) != (total > tc.max) || s.left != total-min(total, tc.max) {
					t.Errorf("seed %d: left %d, error %v", seed, s.left, s.err())
				}
				most := 0
				for uid := range tc.counts {
					most = max(most, len(s.byOwner[uid]))
				}
				for uid, n := range tc.counts {
					if k := len(s.byOwner[uid]); k < n && k < most-1 {
						t.Errorf("seed %d: uid %d kept %d of %d while another kept %d", seed, uid, k, n, most)
					}
				}
			}
		})
	}
}
