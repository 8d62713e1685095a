package ledger

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fill writes n records shaped like a reconcile's snapshot of a
// 4-process tree, and returns their IDs in order.
func fill(tb testing.TB, s *Store, n int) []string {
	tb.Helper()
	ids := make([]string, n)
	for i := range n {
		ids[i] = id(1000 + i)
		err := s.Update(ids[i], func(r *Record) error {
			t := Tree{PGID: 100 + i, Source: "reconcile", SeenAt: time.Now()}
			for k := range 4 {
				t.Members = append(t.Members, Process{PID: 100 + i + k, StartTicks: uint64(4075420 + k), Comm: "kcserver"})
			}
			r.Trees = []Tree{t}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return ids
}

// TestListManyRecords: a ledger read on several goroutines gives every
// record once, in the directory's name order, and an error for each
// unreadable one.
func TestListManyRecords(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ids := fill(t, s, 300)
	for _, n := range []int{5, 150, 299} {
		if err := os.WriteFile(filepath.Join(s.Dir(), ids[n]+".json"), []byte("{tor"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	recs, errs := s.List()
	if len(errs) != 3 {
		t.Errorf("%d errors, want 3: %v", len(errs), errs)
	}
	var got []string
	for _, r := range recs {
		if r == nil {
			t.Fatal("List returned a nil record")
		}
		got = append(got, r.ContainerID)
	}
	want := slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == ids[5] || s == ids[150] || s == ids[299] })
	if !slices.Equal(got, want) {
		t.Errorf("List gave %d records, want the %d readable ones in order", len(got), len(want))
	}
}

// BenchmarkList reads a ledger of 300 records, the live containers of
// a host running 100 per engine.
func BenchmarkList(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	fill(b, s, 300)
	b.ResetTimer()
	for range b.N {
		if recs, errs := s.List(); len(recs) != 300 || len(errs) != 0 {
			b.Fatalf("List = %d records, %v", len(recs), errs)
		}
	}
}
