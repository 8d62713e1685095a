package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
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
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", testutil.BuildTags, "-deps", pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr.Bytes())
	}
	return strings.Fields(string(out))
}

// TestHookLinksNoHTTP fails when cmd/kc-hook's dependency set includes a
// forbidden package.
// The same listing of kc-janitor, which does sweep, must find them: a
// listing that cannot see net/http proves nothing.
func TestHookLinksNoHTTP(t *testing.T) {
	hook := deps(t, module+"/cmd/kc-hook")
	if !slices.Contains(hook, module+"/internal/sockets") {
		t.Fatalf("kc-hook's listing lacks internal/sockets, which reap uses: the listing is broken: %v", hook)
	}
	for _, p := range forbidden {
		if slices.Contains(hook, p) {
			t.Errorf("kc-hook links %s; keep what the janitor alone needs out of the hook's packages (see internal/sockets' package comment)", p)
		}
	}
	janitor := deps(t, module+"/cmd/kc-janitor")
	for _, p := range forbidden {
		if !slices.Contains(janitor, p) {
			t.Errorf("kc-janitor's listing lacks %s: the check cannot tell a forbidden package when it is there", p)
		}
	}
}

// TestBinariesLinkNoTestHelper fails when a shipped binary links a test
// helper: everything under internal/testutil (it starts daemons, builds
// fake supervisors, reads KC_TEST_* variables) or any package named like
// one (…test). The fake supervisor under internal/testutil/kcserver is a
// main package of its own and is never linked either.
func TestBinariesLinkNoTestHelper(t *testing.T) {
	for _, bin := range []string{"kc-hook", "kc-janitor"} {
		t.Run(bin, func(t *testing.T) {
			pkgs := deps(t, module+"/cmd/"+bin)
			if !slices.Contains(pkgs, module+"/internal/fingerprint") {
				t.Fatalf("%s's listing lacks internal/fingerprint: the listing is broken: %v", bin, pkgs)
			}
			for _, p := range pkgs {
				last := p[strings.LastIndexByte(p, '/')+1:]
				if strings.HasPrefix(p, module+"/internal/testutil") || (strings.HasPrefix(p, module+"/") && strings.HasSuffix(last, "test")) {
					t.Errorf("%s links the test helper %s", bin, p)
				}
			}
		})
	}
}

// TestJanitorLinksNoDocConverter fails when kc-janitor, built as the
// Makefile builds it, links a markdown or man page converter: their
// packages' initialisation (blackfriday's regular expressions) ran on
// every start of the janitor, a tenth of its start-up, for a page only
// `kc-janitor man` writes. The Makefile must build with the tags this
// listing uses.
func TestJanitorLinksNoDocConverter(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "TAGS        := "+testutil.BuildTags+"\n") ||
		!regexp.MustCompile(`(?m)^\t\$\(GO\) build .*-tags "\$\(TAGS\)".* -o bin/kc-janitor `).Match(mk) {
		t.Errorf("the Makefile does not build with TAGS %q, as internal/testutil.BuildTags says", testutil.BuildTags)
	}
	janitor := deps(t, module+"/cmd/kc-janitor")
	if !slices.Contains(janitor, "github.com/urfave/cli/v2") {
		t.Fatalf("kc-janitor's listing lacks urfave/cli: the listing is broken: %v", janitor)
	}
	for _, p := range []string{"github.com/cpuguy83/go-md2man/v2/md2man", "github.com/russross/blackfriday/v2"} {
		if slices.Contains(janitor, p) {
			t.Errorf("kc-janitor links %s", p)
		}
	}
}
