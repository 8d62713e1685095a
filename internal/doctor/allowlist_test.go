package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWithRootlessAllowlist: a rootless user's descriptor that launches
// supervisors under the system's allowlist is a warning (the hook, root
// of his namespace, refuses root's file); one naming a file of his own,
// one that only stops, root's, or a host with no system allowlist, say
// nothing.
func TestWithRootlessAllowlist(t *testing.T) {
	system := filepath.Join(t.TempDir(), "supervisors.json")
	if err := os.WriteFile(system, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	create := Descriptor{File: "kc-hook-createruntime.json", Args: []string{"kc-hook", "createRuntime"}, Stages: []string{"createRuntime"}}
	own := create
	own.Env = []string{"KC_SUPERVISORS_FILE=/home/u/.config/kc-watchman/supervisors.json"}
	flag := create
	flag.Args = []string{"kc-hook", "--supervisors-file=/home/u/s.json", "createRuntime"}
	named := create
	named.Env = []string{"KC_SUPERVISORS_FILE=" + system}
	stop := Descriptor{File: "kc-hook-poststop.json", Args: []string{"kc-hook", "poststop"}, Stages: []string{"poststop"}}
	for _, tc := range []struct {
		name     string
		descs    []Descriptor
		rootless bool
		file     string
		warn     bool
	}{
		{"rootless, the system's file", []Descriptor{create, stop}, true, system, true},
		{"rootless, the system's file named", []Descriptor{named}, true, system, true},
		{"rootless, a file of his own", []Descriptor{own}, true, system, false},
		{"rootless, his own by flag", []Descriptor{flag}, true, system, false},
		{"rootless, poststop only", []Descriptor{stop}, true, system, false},
		{"root", []Descriptor{create}, false, system, false},
		{"no system allowlist", []Descriptor{create}, true, filepath.Join(t.TempDir(), "none.json"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := WithRootlessAllowlist(Check{Verdict: OK}, tc.descs, tc.rootless, tc.file)
			if warned := got.Verdict == Warn && len(got.Items) == 1 && strings.Contains(got.Items[0], "KC_SUPERVISORS_FILE"); warned != tc.warn {
				t.Errorf("check %+v; want a warning: %v", got, tc.warn)
			}
		})
	}
}
