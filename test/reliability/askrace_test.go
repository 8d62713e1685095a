//go:build reliability

package reliability

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

const raceAskComm = "kcrel-askrace"

// TestTreeBornWhileAskingIsSpared: the engine is asked while a container
// starts. The podman CLI, when first asked, starts that container's
// supervisor tree (a real process), then answers [] — as an answer
// computed an instant before the container was created would; asked
// again, it lists the container running. No tree is judged by an answer
// older than its read: the run's scan either missed the tree or, seeing
// a tree the answer did not call live, asked again (an old doctor --fix
// asked, then scanned, found the tree and reaped it). Once the container
// is gone, the next run reaps the tree.
func TestTreeBornWhileAskingIsSpared(t *testing.T) {
	for _, cmd := range [][]string{
		{"doctor", "--fix", "--format", "json", "--socket-dir", t.TempDir(), "--hooks-dir", t.TempDir()},
		{"reconcile", "--apply", "--format", "json"},
	} {
		t.Run(cmd[0], func(t *testing.T) {
			cid := newCID(t)
			tmp := t.TempDir()
			pidFile, goneFile := filepath.Join(tmp, "tree.pid"), filepath.Join(tmp, "gone")
			// setsid makes the supervisor lead its own group, as a
			// container's supervisor does; argv[0] carries the ID, as
			// startSupervisor's do.
			podman := fakePodman(t, `if [ ! -e '`+pidFile+`' ]; then
  setsid /bin/bash -c 'exec -a --container-id=`+cid+` `+supervisorBin(t, raceAskComm)+` 1000000' </dev/null >/dev/null 2>&1 &
  echo $! > '`+pidFile+`'
  echo '[]'
elif [ -e '`+goneFile+`' ]; then
  echo '[]'
else
  echo '[{"Id":"`+cid+`","Names":["/askrace"],"State":"running"}]'
fi`)
			env := baseEnv(podman+":/usr/bin:/bin", "KC_STATE_DIR="+t.TempDir(), "KC_SUPERVISOR_COMM="+raceAskComm)
			args := append(append([]string{}, cmd...), janitorGround()...)
			args = append(args, "--engine", "podman", "--container", cid, "--min-age", "0s", "--kill-grace", "200ms")

			r := runTool(t, janitorBin(t), env, "", args...)
			tree := bornTree(t, pidFile)
			if !strings.Contains(r.Stdout, "{") {
				t.Fatalf("%s: no report (exit %d): %s", cmd[0], r.Code, r.Stderr)
			}
			if len(aliveOf(tree)) != 1 || len(stoppedOf(tree)) > 0 {
				t.Fatalf("%s reaped a tree born while the engine was asked\nstdout: %s\nstderr: %s", cmd[0], r.Stdout, r.Stderr)
			}
			report(t, "ask-race", cmd[0]+"_spared_tree_born_while_asking", true)

			if err := os.WriteFile(goneFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			r = runTool(t, janitorBin(t), env, "", args...)
			if !waitAllDead(tree, 10*time.Second) {
				t.Fatalf("%s: the next run did not reap the tree (exit %d)\nstdout: %s\nstderr: %s", cmd[0], r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// bornTree reads the identity of the supervisor the fake podman started,
// and kills it (by identity) when t ends.
func bornTree(t *testing.T, pidFile string) []fingerprint.Stat {
	t.Helper()
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the podman CLI was not asked: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	var st fingerprint.Stat
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err = fingerprint.ReadStat(procRoot, pid)
		if err == nil && st.Comm == raceAskComm && st.PGID == pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tree the podman CLI started is not running as a group leader: %+v %v", st, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	tree := []fingerprint.Stat{st}
	t.Cleanup(func() { killByIdentity(tree) })
	return tree
}
