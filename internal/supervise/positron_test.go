package supervise_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/supervise"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// supervisorWrapperSh stands in for Positron's supervisor-wrapper.sh: an
// output file first, then the command, run as a child of the script
// (whose exit status it records), so a shell stays in the group.
const supervisorWrapperSh = `#!/bin/sh
out=$1
shift
echo "supervisor-wrapper: running $1" >>"$out"
"$@" >>"$out" 2>&1
echo "exit $?" >>"$out"
`

// TestPositronLaunchShape: kc-hook supervise launching Positron's shape —
// a login shell (bash -l -c) running supervisor-wrapper.sh, which runs
// kcserver — gives a tree the janitor may signal: the wrapper leads and
// carries the ID, the shells are members. When init dies, the whole group
// goes, shells, kcserver and kernels alike.
func TestPositronLaunchShape(t *testing.T) {
	_, init := supervisetest.Process(t, "sleep", "1000000")
	script := filepath.Join(t.TempDir(), "supervisor-wrapper.sh")
	if err := os.WriteFile(script, []byte(supervisorWrapperSh), 0o755); err != nil {
		t.Fatal(err)
	}
	fake, ready := fakeKCServer(t, t.TempDir())
	// The login shell execs the script, as the allowlist example in
	// docs/KALLICHORE.md does: one shell less in the group. Its output
	// file is the wrapper's capped log, as there.
	argv := append([]string{"/bin/bash", "-l", "-c", `exec "$0" "$@"`, script, "/dev/stdout"}, fake...)
	w := startWrapper(t, init, []string{"--kill-grace=1s"}, argv...)
	kc := waitReady(t, w, ready)
	if !strings.Contains(w.logText(), "supervisor-wrapper: running ") {
		t.Errorf("the script's output is not in the wrapper's log:\n%s", w.logText())
	}

	var tr *trees.Tree
	supervisetest.Eventually(t, 10*time.Second, "no tree: wrapper, script shell, kcserver, 2 kernels", func() bool {
		found, _, err := trees.Scan(trees.Options{Comms: []string{"kcserver"}})
		if err != nil {
			return false
		}
		for i := range found {
			if found[i].ContainerID == cid && len(found[i].Members) == 5 {
				tr = &found[i]
				return true
			}
		}
		return false
	})
	if tr.PGID != w.st.PID || tr.Foreign || !tr.Signalable() {
		t.Fatalf("tree %+v: want one led by the wrapper %d, signalable", tr, w.st.PID)
	}
	if slices.ContainsFunc(tr.Members, func(m fingerprint.Identity) bool { return m.Comm == "bash" }) {
		t.Errorf("the login shell did not exec the script: %+v", tr.Members)
	}
	members := tr.Stats()
	supervisetest.KillGroups(t, func() []int { return []int{tr.PGID} }, members...)
	if err := killInit(init); err != nil {
		t.Fatal(err)
	}
	supervisetest.Eventually(t, 15*time.Second, "members outlived init", func() bool { return allDead(members) })
	if !supervisetest.Dead(kc) {
		t.Errorf("kcserver %d alive", kc.PID)
	}
}

func killInit(init fingerprint.Stat) error {
	p, err := fingerprint.Pin(fingerprint.DefaultRoot, init)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Signal(9)
}
