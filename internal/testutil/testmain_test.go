package testutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryBuildingPackageCleansUp: a test package that compiles a
// program through Build (directly, or through BuildKCServer,
// StartKCServer or the supervise helpers) must remove it when its tests
// end (TestMain calling Main or RemoveBuilds): else every `go test` of it
// leaves a kc-testkit-build-* directory in the temporary directory.
func TestEveryBuildingPackageCleansUp(t *testing.T) {
	builds := regexp.MustCompile(`\btestutil\.(Build|BuildKCServer|StartKCServer|StartSockServer)\(|\bsupervisetest\.`)
	cleans := regexp.MustCompile(`\btestutil\.(Main|RemoveBuilds)\(|\bsupervisetest\.RemoveBuild\(|(?m)^\s*(Main|RemoveBuilds)\(`)
	type pkg struct{ builds, cleans bool }
	pkgs := map[string]*pkg{}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".tmp" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		p := pkgs[filepath.Dir(path)]
		if p == nil {
			p = &pkg{}
			pkgs[filepath.Dir(path)] = p
		}
		p.builds = p.builds || builds.Match(src)
		p.cleans = p.cleans || strings.Contains(string(src), "func TestMain(") && cleans.Match(src)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := pkgs[filepath.Join(root, "internal", "janitor")]; p == nil || !p.builds {
		t.Fatalf("internal/janitor's tests build the fake kcserver, but the walk did not see it: the check is blind")
	}
	for dir, p := range pkgs {
		if p.builds && !p.cleans {
			t.Errorf("%s: its tests compile programs through testutil but no TestMain removes them (func TestMain(m *testing.M) { testutil.Main(m) })", dir)
		}
	}
}
