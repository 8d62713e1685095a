package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// WithRootlessAllowlist adds to the hook-installed check, for a rootless
// user, each descriptor that launches supervisors from systemFile, the
// system's allowlist: podman runs the hook as root of the user's
// namespace, where root's file shows as another user's (65534), which
// the hook never trusts, so annotated containers get no supervisor. A
// host without that file set no supervisors up: nothing to say.
func WithRootlessAllowlist(c Check, descs []Descriptor, rootless bool, systemFile string) Check {
	if !rootless {
		return c
	}
	if _, err := os.Stat(systemFile); err != nil {
		return c
	}
	for _, d := range descs {
		if d.MaskedBy != "" || !d.Valid() || !launches(d.Stages) {
			continue
		}
		if f, ok := d.Setting("supervisors-file", "KC_SUPERVISORS_FILE"); ok && f != "" && filepath.Clean(f) != filepath.Clean(systemFile) {
			continue
		}
		c.Verdict = max(c.Verdict, Warn)
		c.Items = append(c.Items, fmt.Sprintf("%s: launches supervisors from %s, which the hook (root of your podman's user namespace) sees as another user's and refuses: annotated containers get none; set KC_SUPERVISORS_FILE in its env to a file of yours (ROOTLESS.md)", d.File, systemFile))
	}
	return c
}

// launches says whether a descriptor's stages launch supervisors (the
// stages that record the init).
func launches(stages []string) bool {
	return slices.ContainsFunc(stages, func(st string) bool { return slices.Contains(recordStages, st) })
}
