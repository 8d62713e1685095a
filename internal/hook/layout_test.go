package hook

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
)

// TestPoststopKeepsTheLayoutInTheLedger: poststop leaves the iterator's
// layout in the ledger's own directory for the next hook, and writes
// none when the ledger cannot be written.
func TestPoststopKeepsTheLayoutInTheLedger(t *testing.T) {
	if _, err := taskiter.Load(); err != nil {
		t.Skipf("task iterator not usable here: %v", err)
	}
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cfg := Config{StateDir: t.TempDir(), Comms: []string{"kcserver"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if _, err := Poststop(context.Background(), cfg, &specs.State{ID: id, Status: specs.StateStopped}); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenReadOnly(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(ledger.LayoutCache(store)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("layout file after poststop: %v, %v", st, err)
	}
	if recs, errs := store.List(); len(recs) != 1 || len(errs) != 0 {
		t.Errorf("the ledger lists %d records, %v: the layout file is no record", len(recs), errs)
	}

	// A state dir that is a file: no ledger, no layout file anywhere.
	cfg.StateDir = filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(cfg.StateDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Poststop(context.Background(), cfg, &specs.State{ID: id, Status: specs.StateStopped})
	if err != nil || res.Unrecorded == nil {
		t.Fatalf("poststop with a state dir that is a file: %+v, %v; want it unrecorded", res, err)
	}
	if ents, err := os.ReadDir(filepath.Dir(cfg.StateDir)); err != nil || len(ents) != 1 {
		t.Errorf("next to the state dir: %v, %v; want the file alone", ents, err)
	}
}
