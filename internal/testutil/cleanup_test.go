package testutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryBuilderCleansUp: a test package that compiles binaries with
// Build must remove them when it ends (Main, or RemoveBuilds in its own
// TestMain); else each run leaves a kc-testkit-build-* directory in the
// temp dir, and CI's host hygiene check fails on it.
func TestEveryBuilderCleansUp(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	builds, cleans := map[string]bool{}, map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".tmp") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		src, dir := string(data), filepath.Dir(p)
		if strings.Contains(src, "testutil.Build(") {
			builds[dir] = true
		}
		if strings.Contains(src, "testutil.Main(") || strings.Contains(src, "testutil.RemoveBuilds()") {
			cleans[dir] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(builds) == 0 {
		t.Fatal("no package builds with testutil.Build: the walk found nothing")
	}
	for dir := range builds {
		if !cleans[dir] {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("%s builds with testutil.Build but its TestMain does not remove the builds (testutil.Main)", rel)
		}
	}
}
