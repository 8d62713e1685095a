package reconcile

import (
	"context"

	"github.com/kc-watchman/kc-watchman/internal/engine"
)

// Run scans and then decides with live, an answer taken before the scan.
// Only tests may do this: production code acts only on an answer asked
// after Scan (see Scanned.Doubted).
func Run(ctx context.Context, opt Options, live engine.Set) (Report, error) {
	sc, err := Scan(opt)
	if err != nil {
		return Report{LivenessKnown: true, Source: string(live.Source), DryRun: !opt.Apply, Trees: []Tree{}}, err
	}
	return sc.Run(ctx, live)
}
