package janitor

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestJSONDurations: a duration is logged in seconds in JSON, never in
// nanoseconds.
func TestJSONDurations(t *testing.T) {
	var buf strings.Builder
	h := newHandler(true, &buf, 0, false)
	slog.New(h).Info("watching", "interval", 90*time.Second)
	if !strings.Contains(buf.String(), `"interval_seconds":90`) {
		t.Errorf("JSON duration: %s", buf.String())
	}
}
