//go:build reliability

package reliability

import (
	"os"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func inPIDNS() bool { return proc.InPIDNamespace() }

// runInPIDNS runs the test named name again, as PID 1 of a new PID and
// mount namespace, with the suite's binaries, and decodes the summary it
// writes into out. Inside, the test must call proc.EnterPIDNamespace and
// end with proc.WriteSummary.
func runInPIDNS(t *testing.T, name string, timeout time.Duration, out any, env ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a new PID namespace and ns_last_pid")
	}
	proc.RunInPIDNamespace(t, name, timeout, out, append(env, binEnv+"="+binaries(t))...)
}
