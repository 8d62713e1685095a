package e2e

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/docker"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

// TestPodmanAndDocker: a host running podman and dockerd side by side.
// With --engine auto both are asked, and a tree of a live container of
// either engine is skipped-live. With one engine named, the other
// engine's container is not in the answer, but its monitor process
// (containerd-shim with -id, conmon with the ID) still runs here: DESIGN
// "Ground truth must be corroborated" makes that a contradiction, skipped-contradicted and never
// signalled, even with --apply.
func TestPodmanAndDocker(t *testing.T) {
	d := dockertest.Need(t)
	e := podmantest.New(t)
	url := e.StartAPI(t)
	inDocker := d.Run(t, nil)
	inPodman := e.Run(t)
	t.Cleanup(func() { e.Remove(t, inPodman) })

	const comm = "kcsrv-e2e-2eng"
	trees := map[string][]fingerprint.Stat{}
	for _, id := range []string{inDocker, inPodman} {
		_, trees[id] = startTree(t, t.TempDir(), id, testutil.Fake{Comm: comm})
	}
	env := e.Environ()
	env = slices.DeleteFunc(env, func(kv string) bool {
		return strings.HasPrefix(kv, "KC_") || strings.HasPrefix(kv, "CONTAINERD_ADDRESS=")
	})
	args := []string{"reconcile", "--podman-url", url, "--docker-url", d.URL, "--format", "json", "--state-dir", t.TempDir(),
		"--kill-grace", "500ms", "--supervisor-comm", comm, "--min-age", "0s", "--apply",
		"--container", inDocker, "--container", inPodman}
	for _, a := range e.GlobalArgs() {
		args = append(args, "--podman-arg="+a)
	}

	tests := []struct {
		engine string
		asked  []string
		want   map[string]string // container → action of its tree
	}{
		{"auto", []string{"docker", "podman"}, map[string]string{inDocker: "skipped-live", inPodman: "skipped-live"}},
		{"podman", []string{"podman"}, map[string]string{inDocker: "skipped-contradicted", inPodman: "skipped-live"}},
		{"docker", []string{"docker"}, map[string]string{inDocker: "skipped-live", inPodman: "skipped-contradicted"}},
		{"docker,podman", []string{"docker", "podman"}, map[string]string{inDocker: "skipped-live", inPodman: "skipped-live"}},
	}
	for _, tt := range tests {
		t.Run(tt.engine, func(t *testing.T) {
			out, errOut, code := janitor(t, env, append(args, "--engine", tt.engine)...)
			var rep struct {
				reconcileReport
				Engines []struct {
					Name  string  `json:"name"`
					Live  int     `json:"live"`
					Error *string `json:"error"`
				} `json:"engines"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
				t.Fatalf("exit %d: %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
			}
			var asked []string
			for _, en := range rep.Engines {
				if en.Error != nil || en.Live < 1 {
					t.Errorf("engine %s: live %d, error %v", en.Name, en.Live, en.Error)
				}
				// auto also asks a containerd whose default socket exists
				// on this host; only the two under test are required.
				if en.Name != "containerd" {
					asked = append(asked, en.Name)
				}
			}
			slices.Sort(asked)
			if !slices.Equal(asked, tt.asked) {
				t.Errorf("asked %v, want %v", asked, tt.asked)
			}
			for id, want := range tt.want {
				if got := rep.action(trees[id][0].PGID); got != want {
					t.Errorf("tree of %.12s: %q, want %q", id, got, want)
				}
				if n := len(aliveOf(trees[id])); n != len(trees[id]) {
					t.Errorf("tree of %.12s lost %d members", id, len(trees[id])-n)
				}
			}
		})
	}
}

// TestEngineBadInput: a malformed engine setting or a --container that
// names nothing is a usage error on every command: exit 2, one line on
// stderr saying what is wrong, nothing on stdout, nothing touched.
func TestEngineBadInput(t *testing.T) {
	d := dockertest.Need(t)
	// Two containers sharing a one-character ID prefix (17 are sure to;
	// about five usually do).
	var id, id2 string
	byFirst := map[byte]string{}
	for id2 == "" {
		c := d.Run(t, nil)
		if prev, ok := byFirst[c[0]]; ok {
			id, id2 = prev, c
		}
		byFirst[c[0]] = c
	}
	// A removed container's tree: a bad-input run with --apply that
	// touched anything would reap it.
	stray := d.Run(t, nil)
	const comm = "kcsrv-e2e-bad"
	_, tree := startTree(t, t.TempDir(), stray, testutil.Fake{Comm: comm})
	d.Must(t, "rm", "-f", stray)

	dock := []string{"--docker-url", d.URL}
	reap := []string{"--supervisor-comm", comm, "--min-age", "0s", "--apply", "--state-dir", t.TempDir(), "--container", stray}
	tests := []struct {
		name string
		env  []string
		args []string
		says string
	}{
		{"unknown engine", nil, append([]string{"reconcile", "--engine", "dokcer"}, reap...), `unknown engine "dokcer"`},
		{"unknown engine in a list", nil, append([]string{"reconcile", "--engine", "docker,nope"}, reap...), `unknown engine "nope"`},
		{"unknown engine from KC_ENGINE", []string{"KC_ENGINE=rkt"}, []string{"sweep"}, `unknown engine "rkt"`},
		{"auto with another engine", nil, []string{"status", "--engine", "auto,docker"}, "auto cannot be combined"},
		{"unknown engine, watch", nil, []string{"watch", "--engine", "cri-o"}, `unknown engine "cri-o"`},
		{"docker-url ssh", nil, append([]string{"reconcile", "--engine", "docker", "--docker-url", "ssh://me@host"}, reap...), `scheme "ssh" not supported (unix:// or tcp://)`},
		{"docker-url http", nil, []string{"doctor", "--docker-url", "http://127.0.0.1:2375"}, `scheme "http" not supported`},
		{"docker-url a bare path", nil, []string{"sweep", "--docker-url", "/var/run/docker.sock"}, "not supported (unix:// or tcp://); did you mean unix:///var/run/docker.sock?"},
		{"DOCKER_HOST npipe", []string{"DOCKER_HOST=npipe:////./pipe/docker_engine"}, append([]string{"reconcile", "--engine", "docker"}, reap...), `scheme "npipe" not supported`},
		{"CONTAINER_HOST ssh", []string{"CONTAINER_HOST=ssh://me@host/run/podman/podman.sock"}, append([]string{"reconcile", "--engine", "podman"}, reap...), `CONTAINER_HOST: podman URL "ssh://me@host/run/podman/podman.sock": scheme "ssh" not supported`},
		{"name matching nothing, sweep", nil, append([]string{"sweep", "--engine", "docker", "--container", "kc-no-such-container"}, dock...), `no such container: "kc-no-such-container" (asked docker)`},
		{"name matching nothing, cull", []string{"KC_CONTAINER=kc-no-such-container"}, append([]string{"cull", "--engine", "docker"}, dock...), `no such container: "kc-no-such-container"`},
		{"name matching nothing, reconcile", nil, append(append([]string{"reconcile", "--engine", "docker", "--container", "kc-no-such-container"}, dock...), reap...), `no such container: "kc-no-such-container"`},
		{"prefix of two containers", nil, append([]string{"sweep", "--engine", "docker", "--container", id[:1]}, dock...), id[:12]},
		{"not a container reference", nil, append([]string{"cull", "--engine", "docker", "--container", "../etc"}, dock...), "is not a container name, ID, ID prefix or namespace/pod/container"},
	}
	base := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.HasPrefix(k, "KC_") || k == "DOCKER_HOST" || k == "CONTAINER_HOST"
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := janitor(t, append(slices.Clone(base), tt.env...), tt.args...)
			lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
			if code != 2 || out != "" || len(lines) != 1 || !strings.HasPrefix(lines[0], "kc-janitor: ") || !strings.Contains(lines[0], tt.says) {
				t.Errorf("exit %d, want 2 and one line saying %q\nstdout: %s\nstderr: %s", code, tt.says, out, errOut)
			}
			if tt.name == "prefix of two containers" && !strings.Contains(lines[0], id2[:12]) {
				t.Errorf("the ambiguity names one candidate only: %s", lines[0])
			}
		})
	}
	if n := len(aliveOf(tree)); n != len(tree) {
		t.Errorf("bad input killed %d members of a stray tree", len(tree)-n)
	}
}
