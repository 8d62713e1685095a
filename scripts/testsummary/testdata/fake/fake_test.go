// Package fake holds the tests testsummary's own tests run through it:
// passing, failing, skipped, subtests. It is under testdata, so ./...
// never runs it; its failures run only when KC_TESTSUMMARY_FAKE=1.
package fake

import (
	"os"
	"testing"
)

func fake(t *testing.T) {
	if os.Getenv("KC_TESTSUMMARY_FAKE") != "1" {
		t.Skip("run by testsummary's tests only")
	}
}

func TestPass(t *testing.T) { t.Log("a log line of a passing test") }

func TestFail(t *testing.T) {
	fake(t)
	t.Log("before the failure")
	t.Error("the failure")
}

func TestSkip(t *testing.T) {
	fake(t)
	t.Log("a line before the skip")
	t.Skip("no dockerd: KC_TEST_DOCKER_URL is not set")
}

func TestSkipNow(t *testing.T) {
	fake(t)
	t.SkipNow()
}

func TestSkipMultiline(t *testing.T) {
	fake(t)
	t.Skipf("first line\nsecond line")
}

func TestSub(t *testing.T) {
	fake(t)
	t.Run("ok", func(t *testing.T) {})
	t.Run("skipped", func(t *testing.T) { t.Skip("sub reason") })
	t.Run("failed", func(t *testing.T) { t.Fatal("sub failure") })
}
