package testutil

import (
	"os/exec"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// StartSleep starts `sleep arg` with attr (nil: the test's own group), a
// live process no rule takes for a supervisor, kills it when the test
// ends, and returns its identity.
func StartSleep(t testing.TB, attr *syscall.SysProcAttr, arg string) fingerprint.Stat {
	t.Helper()
	cmd := exec.Command("sleep", arg)
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
