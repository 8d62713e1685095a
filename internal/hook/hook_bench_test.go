package hook

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// BenchmarkPoststop times Poststop in process on the host as it is: for a
// container without a tree (the scan and the ledger writes: the hook's own
// cost) and for one with a 3-process fake supervisor tree (adds SIGTERM,
// the tree's death and pgkill's polling). bench/cmd/kcbench times the real
// binary, with its start-up and peak RSS, on hosts of up to 30k processes
// (docs/PERFORMANCE.md).
func BenchmarkPoststop(b *testing.B) {
	cfg := Config{
		StateDir:  b.TempDir(),
		Comms:     []string{"kcserver"},
		KillGrace: 5 * time.Second,
		Deadline:  20 * time.Second,
		Logger:    slog.New(slog.DiscardHandler),
	}
	b.Run("no-tree", func(b *testing.B) {
		for b.Loop() {
			res, err := Poststop(b.Context(), cfg, &specs.State{ID: benchID(b), Status: specs.StateStopped})
			if err != nil || len(res.Trees) != 0 {
				b.Fatalf("Poststop = %+v, %v", res, err)
			}
		}
	})
	b.Run("one-tree", func(b *testing.B) {
		sock := b.TempDir()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			id := benchID(b)
			k := testutil.StartKCServer(b, sock, testutil.Fake{ContainerID: id, Children: 2})
			b.StartTimer()
			res, err := Poststop(b.Context(), cfg, &specs.State{ID: id, Status: specs.StateStopped})
			b.StopTimer()
			if err != nil || len(res.Trees) != 1 || res.Trees[0].Action != action.Reaped || len(res.Trees[0].Members) != 4 {
				b.Fatalf("Poststop = %+v, %v", res, err)
			}
			k.Wait(b)
			b.StartTimer()
		}
	})
}

func benchID(b *testing.B) string {
	var r [32]byte
	if _, err := rand.Read(r[:]); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(r[:])
}
