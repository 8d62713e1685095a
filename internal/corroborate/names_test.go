package corroborate

import "testing"

func TestNameMatches(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		path string
		want bool
	}{
		{"/machine.slice/libpod-" + id + ".scope", true},
		{"/machine.slice/libpod-" + id + ".scope/container", true},
		{"/machine.slice/libpod-" + id + ".scope/init.scope", true},
		{"/machine.slice/libpod-" + id + ".scope/container/init.scope", true},
		{"/machine.slice/libpod-" + id + ".scope/init.scope/container", false},
		{"/machine.slice/libpod-conmon-" + id + ".scope/init.scope", false},
		{"/libpod_parent/libpod-" + id, true},
		{"/libpod_parent/libpod-payload-" + id, true},
		{"/system.slice/docker-" + id + ".scope", true},
		{"/docker/" + id, true},
		{"/k8s.io/" + id, true},
		{"/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope", true},
		{"/kubepods/besteffort/pod1/" + id, true},
		{"/crio-" + id + ".scope", true},
		{"/crio-" + id, true},
		{"/nerdctl-" + id + ".scope", true},
		// Monitors' cgroups and the like are never the container's.
		{"/machine.slice/libpod-conmon-" + id + ".scope", false},
		{"/crio-conmon-" + id + ".scope", false},
		{"/machine.slice/libpod-" + id + ".scope/runtime", false},
		{"/k8s.io/" + id + "x", false},
		{"/" + id + "/sub", false},
		{"/", false},
	} {
		if got := NameMatches(c.path, id); got != c.want {
			t.Errorf("NameMatches(%q) = %v, want %v", c.path, got, c.want)
		}
	}
}

// TestOwnCgroupsAreNoEvidence: kc-watchman's own cgroups are named after
// the container a supervisor serves (kc-watchman/<id>); a process in one
// is the tree's, never evidence that the container runs, whatever the
// hierarchy.
func TestOwnCgroupsAreNoEvidence(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	c := &Checker{}
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"0::/kc-watchman/" + id, false},
		{"6:freezer:/kc-watchman/" + id, false},
		{"1:name=systemd:/kc-watchman/" + id, false},
		{"0::/kc-watchman.slice/kc-watchman-" + id + ".scope", false},
		{"0::/docker/" + id, true}, // control: an engine's own
	} {
		t.Run(tc.line, func(t *testing.T) {
			if _, got := c.inContainer([]string{tc.line}, id, nil); got != tc.want {
				t.Errorf("inContainer(%q) = %v, want %v", tc.line, got, tc.want)
			}
		})
	}
}
