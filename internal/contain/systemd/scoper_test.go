package systemd

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/contain"
)

var _ contain.Scoper = (*Manager)(nil)

// TestSlicePathAgrees: internal/contain checks a scope's cgroup against
// its own idea of where systemd puts kc-watchman.slice; it must be
// systemd's nesting rule's.
func TestSlicePathAgrees(t *testing.T) {
	p, err := SlicePath(contain.Slice)
	if err != nil {
		t.Fatal(err)
	}
	if p != "/"+contain.SlicePath {
		t.Fatalf("SlicePath(%s) = %s, contain expects /%s", contain.Slice, p, contain.SlicePath)
	}
}
