package testutil

import "testing"

// TestMain removes the binaries Build compiled for these tests.
func TestMain(m *testing.M) { Main(m) }
