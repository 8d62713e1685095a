package pgkill_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// BenchmarkKillTERMObedientGroup measures what kc-hook pays in a
// container's stop path for a small tree that dies at once on SIGTERM:
// one Kill, with the options kc-hook uses (the defaults), of a 3-process
// group. Starting and reaping the processes is not timed.
func BenchmarkKillTERMObedientGroup(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cmds := []*exec.Cmd{sleepCmd(), sleepCmd(), sleepCmd()}
		g := startGroup(b, cmds...)
		b.StartTimer()

		res := pgkill.Kill(context.Background(), g, pgkill.Options{})

		b.StopTimer()
		if res.Outcome != action.Reaped || len(res.Signals) != 1 || res.Err != nil {
			b.Fatalf("Kill = %+v; want reaped by SIGTERM alone", res)
		}
		for _, cmd := range cmds {
			proc.Reap(cmd)
		}
		b.StartTimer()
	}
}
