package supervise

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// TestPollingTakesOnlyAbsenceForDeath: while the init's stat cannot be
// read for a reason other than its absence (here a directory where the
// file should be, standing for EMFILE or ENOMEM under load), the init is
// not taken for dead: that would have its supervisors killed while the
// container runs. Once its PID is held by nothing, it is.
func TestPollingTakesOnlyAbsenceForDeath(t *testing.T) {
	root := t.TempDir()
	stat := filepath.Join(root, "4242", "stat")
	if err := os.MkdirAll(stat, 0o755); err != nil {
		t.Fatal(err)
	}
	init := fingerprint.Stat{PID: 4242, StartTicks: 100}
	if _, err := fingerprint.ReadStat(root, init.PID); err == nil || errors.Is(err, fingerprint.ErrNotFound) {
		t.Fatalf("the fixture's stat reads as %v; want an error other than absence", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const interval = 5 * time.Millisecond
	dead, how, err := watchInit(ctx, root, init, true, interval)
	if err != nil || how != WatchPoll {
		t.Fatalf("watchInit = %q, %v; want polling", how, err)
	}
	select {
	case <-dead:
		t.Fatal("an unreadable stat was taken for the init's death")
	case <-time.After(20 * interval):
	}
	if err := os.RemoveAll(filepath.Dir(stat)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dead:
	case <-time.After(10 * time.Second):
		t.Fatal("the init's PID held by nothing was not taken for its death")
	}
}
