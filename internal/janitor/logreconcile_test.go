package janitor

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// TestLogReconcileSaysWhySpared: the summary line counts the trees spared
// by reason, so an audit of the log alone sees why they were not stray.
func TestLogReconcileSaysWhySpared(t *testing.T) {
	rep := reconcile.Report{Source: "api", DryRun: true, Trees: []reconcile.Tree{
		{Action: action.WouldReap}, {Action: action.SkipYoung}, {Action: action.SkipYoung}, {Action: action.SkipLive},
	}}
	var b bytes.Buffer
	LogReconcile(t.Context(), slog.New(slog.NewTextHandler(&b, nil)), rep)
	var summary string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "msg=reconcile ") {
			summary = l
		}
	}
	for _, want := range []string{"trees=4", "would_reap=1", "skipped_live=1", "skipped_young=2"} {
		if !strings.Contains(summary, " "+want) {
			t.Errorf("summary %q lacks %s", summary, want)
		}
	}
	if strings.Contains(summary, "skipped_foreign") || strings.Contains(summary, "cgroups=") {
		t.Errorf("summary %q names what did not occur", summary)
	}
}
