package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: the new content replaces the old, a symlink at path is
// replaced rather than written through, the mode is the one asked, and no
// temporary file is left behind.
func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir, path string) (victim string)
		mode  os.FileMode
	}{
		{"new file", func(*testing.T, string, string) string { return "" }, 0o600},
		{"existing file", func(t *testing.T, _, path string) string {
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			return ""
		}, 0o644},
		{"symlink at path", func(t *testing.T, _, path string) string {
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, path); err != nil {
				t.Fatal(err)
			}
			return victim
		}, 0o600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			victim := tc.setup(t, dir, path)
			if err := Write(dir, ".f.tmp-*", path, []byte("new"), tc.mode, "test file"); err != nil {
				t.Fatal(err)
			}
			st, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Mode().IsRegular() || st.Mode().Perm() != tc.mode {
				t.Errorf("path is %v, want a regular file of mode %v", st.Mode(), tc.mode)
			}
			if b, _ := os.ReadFile(path); string(b) != "new" {
				t.Errorf("content %q, want %q", b, "new")
			}
			if victim != "" {
				if b, _ := os.ReadFile(victim); string(b) != "precious" {
					t.Errorf("the symlink's target was written: %q", b)
				}
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("dir holds %d entries, want only the file: %v", len(ents), ents)
			}
		})
	}
}
