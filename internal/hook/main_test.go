package hook

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestMain runs this binary as a helper process when asked to, and
// removes the binaries testutil.Build compiled for these tests.
func TestMain(m *testing.M) {
	proc.Main()
	testutil.Main(m)
}
