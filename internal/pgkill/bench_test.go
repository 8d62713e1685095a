package pgkill_test

import (
	"context"
	"os/exec"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testkit/proc"
)

// BenchmarkKillTERMObedientGroup measures what kc-hook pays in a
// container's stop path for a small tree that dies at once on SIGTERM:
// one Kill, with the options kc-hook uses (the defaults), of a 3-process
// group. Starting and reaping the processes is not timed.
func BenchmarkKillTERMObedientGroup(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cmds := []*exec.Cmd{sleepCmd(), sleepCmd(), sleepCmd()}
		g := startGroupTB(b, cmds...)
		b.StartTimer()

		res := pgkill.Kill(context.Background(), g, pgkill.Options{})

		b.StopTimer()
		if res.Outcome != pgkill.Reaped || len(res.Signals) != 1 || res.Err != nil {
			b.Fatalf("Kill = %+v; want reaped by SIGTERM alone", res)
		}
		for _, cmd := range cmds {
			proc.Reap(cmd)
		}
		b.StartTimer()
	}
}

// startGroupTB starts cmds in one new process group led by the first and
// returns the group once every member has exec'd its program.
func startGroupTB(tb testing.TB, cmds ...*exec.Cmd) pgkill.Group {
	tb.Helper()
	var g pgkill.Group
	for i, cmd := range cmds {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.PGID}
		proc.Start(tb, cmd)
		if i == 0 {
			g.PGID = cmd.Process.Pid
		}
	}
	for _, cmd := range cmds {
		pid := cmd.Process.Pid
		var st fingerprint.Stat
		proc.WaitFor(tb, waitLong, "the group's members to exec", func() bool {
			s, err := fingerprint.ReadStat(root, pid)
			st = s
			return err == nil && s.Comm == "sleep"
		})
		if st.PGID != g.PGID {
			tb.Fatalf("test setup: pid %d in group %d, want %d", pid, st.PGID, g.PGID)
		}
		g.Members = append(g.Members, st)
	}
	return g
}
