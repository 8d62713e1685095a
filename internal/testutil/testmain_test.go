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
	err := eachTestFile(root, func(path string, src []byte) error {
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

// TestFuzzScriptRunsEveryTarget: scripts/fuzz.sh (make fuzz, CI) names
// every fuzz target of the tree with its package; a new one left out of
// it would never be fuzzed.
func TestFuzzScriptRunsEveryTarget(t *testing.T) {
	root := filepath.Join("..", "..")
	script, err := os.ReadFile(filepath.Join(root, "scripts", "fuzz.sh"))
	if err != nil {
		t.Fatal(err)
	}
	fuzz := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := 0
	err = eachTestFile(root, func(path string, src []byte) error {
		for _, m := range fuzz.FindAllSubmatch(src, -1) {
			found++
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			if want := `"./` + filepath.ToSlash(rel) + " " + string(m[1]) + `"`; !strings.Contains(string(script), want) {
				t.Errorf("scripts/fuzz.sh does not run %s (want the line %s)", m[1], want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no fuzz target found: the check is blind")
	}
}

// eachTestFile calls fn with every _test.go file of the tree under root
// and its content.
func eachTestFile(root string, fn func(path string, src []byte) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
		return fn(path, src)
	})
}
