package doctor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestConfHooksDirs: containers.conf files are read in podman's order, a
// later hooks_dir replacing an earlier one unless an {append=true}, in it
// or in an earlier file, makes it append (podman's attributed lists), and
// CONTAINERS_CONF and CONTAINERS_CONF_OVERRIDE do what podman makes of
// them.
func TestConfHooksDirs(t *testing.T) {
	conf := func(dirs string) string { return "[engine]\nhooks_dir = " + dirs + "\n" }
	tests := []struct {
		name    string
		uid     int
		files   map[string]string // relative to the test's root
		env     map[string]string // values relative to the root
		want    []string
		wantErr bool
	}{
		{name: "no file", want: DefaultConfHooksDirs},
		{name: "a file without hooks_dir", files: map[string]string{"etc/containers.conf": "[engine]\ncgroup_manager = \"cgroupfs\"\n"}, want: DefaultConfHooksDirs},
		{name: "the administrator's replaces the vendor's", files: map[string]string{
			"usr/containers.conf": conf(`["/usr-hooks"]`),
			"etc/containers.conf": conf(`["/etc-hooks"]`),
		}, want: []string{"/etc-hooks"}},
		{name: "drop-ins in name order", files: map[string]string{
			"etc/containers.conf":           conf(`["/etc-hooks"]`),
			"etc/containers.conf.d/20.conf": conf(`["/twenty"]`),
			"etc/containers.conf.d/10.conf": conf(`["/ten"]`),
			"etc/containers.conf.d/30.txt":  conf(`["/not-a-conf"]`),
		}, want: []string{"/twenty"}},
		{name: "append", files: map[string]string{
			"etc/containers.conf":           conf(`["/etc-hooks"]`),
			"etc/containers.conf.d/10.conf": conf(`["/more", {append=true}]`),
		}, want: []string{"/etc-hooks", "/more"}},
		{name: "the user's last", files: map[string]string{
			"etc/containers.conf":  conf(`["/etc-hooks"]`),
			"home/containers.conf": conf(`["/home-hooks"]`),
		}, want: []string{"/home-hooks"}},
		{name: "rootless overrides only for a rootless UID", uid: 0, files: map[string]string{
			"etc/containers.rootless.conf": conf(`["/rootless"]`),
		}, want: DefaultConfHooksDirs},
		{name: "rootless overrides", uid: 1000, files: map[string]string{
			"etc/containers.conf":                        conf(`["/etc-hooks"]`),
			"etc/containers.rootless.conf":               conf(`["/rootless"]`),
			"etc/containers.rootless.conf.d/1000/a.conf": conf(`["/mine"]`),
		}, want: []string{"/mine"}},
		{name: "CONTAINERS_CONF alone", files: map[string]string{
			"etc/containers.conf": conf(`["/etc-hooks"]`),
			"mine.conf":           "[engine]\n",
		}, env: map[string]string{"CONTAINERS_CONF": "mine.conf"}, want: DefaultConfHooksDirs},
		{name: "CONTAINERS_CONF missing", env: map[string]string{"CONTAINERS_CONF": "absent.conf"}, wantErr: true},
		{name: "CONTAINERS_CONF_OVERRIDE wins", files: map[string]string{
			"home/containers.conf": conf(`["/home-hooks"]`),
			"override.conf":        conf(`["/override"]`),
		}, env: map[string]string{"CONTAINERS_CONF_OVERRIDE": "override.conf"}, want: []string{"/override"}},
		{name: "malformed", files: map[string]string{"etc/containers.conf": "[engine\n"}, wantErr: true},
		{name: "not a list of paths", files: map[string]string{"etc/containers.conf": conf(`[1]`)}, wantErr: true},
		{name: "append first", files: map[string]string{"etc/containers.conf": conf(`[{append=true}, "/x"]`)}, want: append(slices.Clone(DefaultConfHooksDirs), "/x")},
		{name: "append carries over to later files", files: map[string]string{
			"etc/containers.conf":           conf(`["/a", {append=true}]`),
			"etc/containers.conf.d/10.conf": conf(`["/b"]`),
		}, want: append(slices.Clone(DefaultConfHooksDirs), "/a", "/b")},
		{name: "append=false replaces", files: map[string]string{
			"etc/containers.conf":           conf(`["/a", {append=true}]`),
			"etc/containers.conf.d/10.conf": conf(`["/b", {append=false}]`),
		}, want: []string{"/b"}},
		{name: "an attribute podman does not know", files: map[string]string{"etc/containers.conf": conf(`["/x", {prepend=true}]`)}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for rel, content := range tt.files {
				p := filepath.Join(root, rel)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			paths := ConfPaths{Usr: filepath.Join(root, "usr/containers.conf"), Etc: filepath.Join(root, "etc/containers.conf"), Home: filepath.Join(root, "home/containers.conf"), UID: tt.uid}
			getenv := func(k string) string {
				if v, ok := tt.env[k]; ok {
					return filepath.Join(root, v)
				}
				return ""
			}
			got, err := ConfHooksDirs(paths, getenv)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
