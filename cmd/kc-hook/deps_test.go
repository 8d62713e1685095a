package main

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kc-watchman/kc-watchman"

// forbidden are packages kc-hook must not link. The hook runs on every
// container start and stop and is budgeted for latency
// (docs/PERFORMANCE.md): net/http alone added 2.4 MB to the binary and
// about 0.8 ms to each launch when the janitor's sweep, with its /status
// probe, shared a package with the tree's own sockets the hook needs.
var forbidden = []string{
	"net/http",
	module + "/internal/kallichore",
	module + "/internal/sweep",
}

// deps lists the packages pkg links, built as the Makefile builds it.
func deps(t *testing.T, tags, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr.Bytes())
	}
	return strings.Fields(string(out))
}

// TestHookLinksNoHTTP fails when cmd/kc-hook's dependency set, with
// either tag set the project builds with, includes a forbidden package.
// The same listing of kc-janitor, which does sweep, must find them: a
// listing that cannot see net/http proves nothing.
func TestHookLinksNoHTTP(t *testing.T) {
	for _, tags := range []string{"", "remote containers_image_openpgp"} {
		t.Run("tags="+tags, func(t *testing.T) {
			hook := deps(t, tags, module+"/cmd/kc-hook")
			if !slices.Contains(hook, module+"/internal/sockets") {
				t.Fatalf("kc-hook's listing lacks internal/sockets, which reap uses: the listing is broken: %v", hook)
			}
			for _, p := range forbidden {
				if slices.Contains(hook, p) {
					t.Errorf("kc-hook links %s; keep what the janitor alone needs out of the hook's packages (see internal/sockets' package comment)", p)
				}
			}
			janitor := deps(t, tags, module+"/cmd/kc-janitor")
			for _, p := range forbidden {
				if !slices.Contains(janitor, p) {
					t.Errorf("kc-janitor's listing lacks %s: the check cannot tell a forbidden package when it is there", p)
				}
			}
		})
	}
}
