package janitor

import (
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// TestReportTextSaysWhatAnApplyWouldDo: the text report's last line says
// what an apply run would do with the strays found, or why it refused;
// the blast-radius guard's "would reap nothing" is the README's audit cue.
func TestReportTextSaysWhatAnApplyWouldDo(t *testing.T) {
	stray := reconcile.Tree{ContainerID: strings.Repeat("a", 64), PGID: 100, Action: action.WouldReap}
	for _, tc := range []struct {
		name string
		rep  reconcile.Report
		want string
	}{
		{"dry run", reconcile.Report{LivenessKnown: true, DryRun: true, Trees: []reconcile.Tree{stray}},
			"1 stray tree(s) would be reaped; run with --apply to reap them"},
		{"dry run the guard would refuse", reconcile.Report{LivenessKnown: true, DryRun: true, Trees: []reconcile.Tree{stray}, WouldRefuse: "too many"},
			"1 stray tree(s) found, but an --apply run would reap nothing: too many"},
		{"apply refused", reconcile.Report{LivenessKnown: true, Trees: []reconcile.Tree{stray}, Refused: "too many"},
			"nothing was reaped: too many"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			Report{Report: tc.rep}.Text(&b)
			if !strings.Contains(b.String(), tc.want+"\n") {
				t.Errorf("text report:\n%s\nwant a line %q", b.String(), tc.want)
			}
		})
	}
}
