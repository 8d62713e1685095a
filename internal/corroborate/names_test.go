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
