package headbuf

import (
	"bytes"
	"testing"
)

func TestBuffer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		max     int
		writes  []string
		want    string
		dropped bool
	}{
		{"nothing written", 4, nil, "", false},
		{"under the cap", 4, []string{"ab"}, "ab", false},
		{"exactly the cap", 4, []string{"ab", "cd"}, "abcd", false},
		{"one write across the cap", 4, []string{"abcdef"}, "abcd", true},
		{"writes after the cap", 4, []string{"abc", "de", "fgh"}, "abcd", true},
		{"an empty write at the cap", 4, []string{"abcd", ""}, "abcd", false},
		{"no room at all", 0, []string{"a"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Buffer{Max: tc.max}
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if !bytes.Equal(b.Bytes(), []byte(tc.want)) {
				t.Errorf("Bytes = %q, want %q", b.Bytes(), tc.want)
			}
			if b.Dropped() != tc.dropped {
				t.Errorf("Dropped = %v, want %v", b.Dropped(), tc.dropped)
			}
		})
	}
}
