package trees

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	helper "github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestMain runs the helper processes of package proc when asked to, and
// removes the binaries testutil.Build compiled for these tests.
func TestMain(m *testing.M) {
	helper.Main()
	testutil.Main(m)
}
