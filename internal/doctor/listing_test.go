package doctor

import (
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// TestListing runs where the tests run: as root on a kernel with BTF, so
// auto and on take the iterator and off never tries it.
func TestListing(t *testing.T) {
	for _, tt := range []struct {
		lister trees.Lister
		want   string
	}{
		{trees.ListAuto, "BPF task iterator: "},
		{trees.ListBPF, "BPF task iterator: "},
		{trees.ListProc, "/proc; --bpf off"},
	} {
		t.Run(tt.lister.String(), func(t *testing.T) {
			c := Listing(tt.lister)
			if c.Name != NameListing || c.Verdict != OK || !strings.HasPrefix(c.Detail, tt.want) {
				t.Errorf("Listing(%v) = %+v, want ok starting %q", tt.lister, c, tt.want)
			}
		})
	}
}
