package sweep

import (
	"fmt"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestForgedNetUnixLineKeepsNoOrphan: a user binds a socket whose name
// holds a newline and a made-up /proc/net/unix line naming root's orphan
// as a listener. Gate 2 reads the host's table from sock_diag, which no
// name can forge: the orphan is stale and unlinked (read from net/unix,
// it was "listener in net/unix", kept every run).
func TestForgedNetUnixLineKeepsNoOrphan(t *testing.T) {
	dir := shortTemp(t)
	orphan := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if !testutil.ForgeNetUnixLine(t, dir, orphan) {
		t.Fatalf("the forged name does not fit under %s", dir)
	}
	cfg := fastConfig(dir)
	cfg.Apply = true
	got := sweep(t, cfg)
	if s := got[orphan]; s == nil || s.Verdict != VerdictStale || testutil.PathExists(orphan) {
		t.Errorf("orphan: %+v; want stale and unlinked", s)
	}
}
