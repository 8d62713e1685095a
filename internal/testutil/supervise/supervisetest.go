// Package supervisetest holds helpers for tests of the supervise layer:
// building the real kc-hook binary (the wrapper must run as its own
// process: it signals its whole process group), polling for conditions,
// and killing process groups by identity on cleanup.
package supervisetest

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// KCHookPackage is the import path of the hook binary.
const KCHookPackage = testutil.KCHookPackage

// BuildKCHook builds cmd/kc-hook once per test binary as a binary named
// exactly "kc-hook", so that the wrapper's comm is trees.WrapperComm, and
// returns its path (see testutil.Build).
func BuildKCHook(t testing.TB) string {
	t.Helper()
	return testutil.Build(t, KCHookPackage, "kc-hook")
}

// RemoveBuild removes what BuildKCHook built; call it from TestMain.
func RemoveBuild() { testutil.RemoveBuilds() }

// Eventually polls cond every 10ms until it returns true or timeout
// passes, then fails t with msg.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("after %v: %s", timeout, msg)
	}
}

// Within polls cond every 10ms for up to timeout and reports whether it
// became true.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Dead reports whether the process is gone or a zombie (PID 1 on these
// machines reaps orphans lazily).
func Dead(st fingerprint.Stat) bool {
	return !fingerprint.Alive(fingerprint.DefaultRoot, st)
}

// KillGroups registers a cleanup that SIGKILLs, by pinned identity, every
// live member of the groups that the function returns at cleanup time,
// plus the listed processes.
func KillGroups(t testing.TB, groups func() []int, procs ...fingerprint.Stat) {
	t.Cleanup(func() {
		var ms []fingerprint.Stat
		if gs := groups(); len(gs) > 0 {
			ms = pgkill.Members(fingerprint.DefaultRoot, gs...)
		}
		for _, m := range append(ms, procs...) {
			KillProcess(m)
		}
	})
}

// KillProcess SIGKILLs st if it is still that process.
func KillProcess(st fingerprint.Stat) {
	pin, err := fingerprint.Pin(fingerprint.DefaultRoot, st)
	if err != nil {
		return
	}
	defer pin.Close()
	pin.Signal(syscall.SIGKILL) //nolint:errcheck // best effort in cleanup
}

// Process starts argv as a child in its own process group (so signals to
// the test's group never reach it, nor the other way round), registers its
// SIGKILL and reaping on cleanup, and returns its identity.
func Process(t testing.TB, argv ...string) (*exec.Cmd, fingerprint.Stat) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck // exit status is not the point
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid)
	if err != nil {
		t.Fatalf("read stat of %d: %v", cmd.Process.Pid, err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // it may be gone
		<-done
	})
	return cmd, st
}
