package trees

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testkit"
)

// TestMain removes the binaries testkit.Build compiled for these tests.
func TestMain(m *testing.M) { testkit.Main(m) }
