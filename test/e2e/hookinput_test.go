package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/supervise"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// badInputScript runs kc-hook ($1) at stage $2 on input kind $3, appends
// "stage kind exit-code" to $4 and exits with kc-hook's code, so runc sees
// exactly what kc-hook said.
const badInputScript = `hook=$1 stage=$2 kind=$3 log=$4
case $kind in
as-given) "$hook" "$stage" ;;
garbage) cat >/dev/null; printf 'garbage{' | "$hook" "$stage" ;;
empty) cat >/dev/null; "$hook" "$stage" </dev/null ;;
non-hex-id) sed 's/"id": *"[0-9a-f]*"/"id":"not-a-hex-id!"/' | "$hook" "$stage" ;;
unwritable-state) KC_STATE_DIR=/dev/null/kc-state "$hook" "$stage" ;;
esac
rc=$?
echo "$stage $kind $rc" >>"$log"
exit $rc`

// TestPreStartBadInputRealPodman: kc-hook at every pre-start
// stage podman runs on the host, on each kind of input it cannot use — a
// bad supervisor annotation with no allowlist, garbage or empty state on
// stdin, a container ID that is not hex (as ctr/nerdctl allow), a state
// dir it cannot write — never stops a real container from starting.
// createContainer and startContainer hooks run in the container's mount
// namespace, where kc-hook is not installed; cmd/kc-hook's
// TestPreStartBadInputNeverFails covers them by hand.
func TestPreStartBadInputRealPodman(t *testing.T) {
	e := podmantest.New(t)
	hook := bin(t, "kc-hook")
	state := t.TempDir()
	log := filepath.Join(t.TempDir(), "exits.log")
	// A hook that cannot write its state dir leaves its trace in the
	// root hook's fixed place; take it away again unless it was there.
	if trace := ledger.RootStateDir + ".trace"; !testutil.PathExists(trace) {
		t.Cleanup(func() { os.Remove(trace) })
	}

	stages := []string{"prestart", "createRuntime", "poststart"}
	kinds := []string{"as-given", "garbage", "empty", "non-hex-id", "unwritable-state"}
	for _, stage := range stages {
		for _, kind := range kinds {
			e.WriteHook(t, "kc-bad-"+strings.ToLower(stage)+"-"+kind, "/bin/sh",
				[]string{"sh", "-c", badInputScript, "sh", hook, stage, kind, log},
				[]string{"PATH=/usr/bin:/bin", "KC_STATE_DIR=" + state, "KC_SUPERVISORS_FILE=/nonexistent/kc-supervisors.json"},
				stage)
		}
	}

	id := e.Run(t, "--annotation", supervise.Annotation+"=../../not-a-supervisor")
	if st := e.State(t, id); st != "running" {
		t.Fatalf("container is %s after run", st)
	}

	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("no hook ran: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, stage := range stages {
		for _, kind := range kinds {
			if !slices.Contains(lines, stage+" "+kind+" 0") {
				t.Errorf("%s with %s input: not run or not exit 0 (log: %q)", stage, kind, lines)
			}
		}
	}
	t.Logf("%d hook runs, all exit 0; container %.12s running", len(lines), id)
}
