package e2e

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
)

// TestUserJanitorBesideRootDocker: a user's janitor on a host where root
// runs Docker. The user cannot ask root's dockerd, so his podman answers
// alone, and his tree of a running Docker container is not in that
// answer. The container's processes are children of root's
// containerd-shim in its cgroup, evidence for any user whatever UID the
// container runs as (root's, or a third user's with --user): each tree is
// skipped-contradicted, kept whole, even with --apply.
// His tree of a container no engine has is reaped in the same run, so the
// run does reap what is stray.
func TestUserJanitorBesideRootDocker(t *testing.T) {
	ru := needRootlessUser(t)
	d := dockertest.Need(t)
	hook := ru.install(t, bin(t, "kc-hook"), "kc-hook")
	kcj := ru.install(t, bin(t, "kc-janitor"), "kc-janitor")
	fake := ru.install(t, testutil.BuildKCServer(t), "kcserver")

	// One run each (two contradicted trees in one run make it exit 3),
	// each with a tree of a container no engine has, reaped.
	for _, tc := range []struct {
		name string
		opts []string
	}{
		{"running as root", nil},
		{"running as a third user", []string{"--user", "4242:4242"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inDocker := d.Run(t, tc.opts)
			stray := testutil.RandomHex(t, 64) // no engine has it
			_, livePGID := ru.startUserTree(t, hook, fake, inDocker)
			strayFake, strayPGID := ru.startUserTree(t, hook, fake, stray)
			liveMembers := group(t, livePGID)

			out, code := ru.run(t, ru.env(), kcj, "reconcile", "--apply", "--min-age", "0s", "--kill-grace", "500ms",
				"--container", inDocker, "--container", stray, "--state-dir", filepath.Join(ru.dir, "state"), "--format", "json")
			var rep struct {
				reconcileReport
				Engines []struct {
					Name string `json:"name"`
				} `json:"engines"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
				t.Fatalf("reconcile as %s: exit %d, %v: %s", ru.name, code, err, out)
			}
			for _, e := range rep.Engines {
				if e.Name == "docker" {
					t.Fatalf("the user's janitor asked root's dockerd; this test needs it left out: %s", out)
				}
			}
			if got := rep.action(livePGID); got != "skipped-contradicted" {
				t.Errorf("the tree of running Docker container %.12s: %q, want skipped-contradicted: %s", inDocker, got, out)
			}
			if got := rep.action(strayPGID); got != "reaped" {
				t.Errorf("the tree of a container no engine has: %q, want reaped: %s", got, out)
			}
			waitAllDead(t, []fingerprint.Stat{strayFake}, 15*time.Second)
			if alive := aliveOf(liveMembers); len(alive) != len(liveMembers) {
				t.Errorf("the Docker container's tree lost %d of %d members", len(liveMembers)-len(alive), len(liveMembers))
			}
		})
	}
}
