package sockets

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestMain removes the binaries testutil.Build compiled for these tests.
func TestMain(m *testing.M) { testutil.Main(m) }
