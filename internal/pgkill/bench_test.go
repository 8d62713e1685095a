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
// one Kill of a 3-process group, root's with the defaults, and another
// user's with the group signalled as that user (CheckUID, as reap does).
// Starting and reaping the processes is not timed.
func BenchmarkKillTERMObedientGroup(b *testing.B) {
	for _, bc := range []struct {
		name  string
		start func() *exec.Cmd
		opt   pgkill.Options
	}{
		{"root", sleepCmd, pgkill.Options{}},
		{"uid65534", func() *exec.Cmd {
			return exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000")
		}, pgkill.Options{UID: 65534, CheckUID: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				cmds := []*exec.Cmd{bc.start(), bc.start(), bc.start()}
				g := startGroup(b, cmds...)
				b.StartTimer()

				res := pgkill.Kill(context.Background(), g, bc.opt)

				b.StopTimer()
				if res.Outcome != action.Reaped || len(res.Signals) != 1 || res.Err != nil {
					b.Fatalf("Kill = %+v; want reaped by SIGTERM alone", res)
				}
				for _, cmd := range cmds {
					proc.Reap(cmd)
				}
				b.StartTimer()
			}
		})
	}
}
