package janitor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestAuditKeepsTheSweepDeadline: cull's audit, for cull, watch and
// doctor, ends at the sweep deadline however long each supervisor may
// take to its timeout.
func TestAuditKeepsTheSweepDeadline(t *testing.T) {
	dir := t.TempDir()
	var srcs []cull.Source
	for range 4 {
		h := testutil.StartKCServer(t, dir, testutil.Fake{Hang: true})
		srcs = append(srcs, cull.Source{Socket: h.Socket, PID: h.PID})
	}
	cfg := sweep.Config{Timeout: 30 * time.Second, Workers: 1, Deadline: 200 * time.Millisecond}
	start := time.Now()
	got := Audit(context.Background(), cfg, srcs, 86400)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the audit took %v past a 200ms deadline", took)
	}
	for i, s := range got {
		if s.Err == nil || (i > 0 && !errors.Is(s.Err, cull.ErrNotAudited)) {
			t.Errorf("supervisor %d: %v; want it timed out (the first) or not audited", i, s.Err)
		}
	}
}
