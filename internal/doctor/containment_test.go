package doctor

import (
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/contain"
)

func TestContainment(t *testing.T) {
	for _, tc := range []struct {
		host   contain.Host
		want   string
		remedy bool
	}{
		{contain.Host{Kind: contain.KindCgroup2, Mount: "/sys/fs/cgroup/unified", Why: "PID 1 is not systemd"}, "cgroup v2 at /sys/fs/cgroup/unified: PID 1 is not systemd", false},
		{contain.Host{Kind: contain.KindFreezer, Mount: "/sys/fs/cgroup/freezer", Why: "x"}, "cgroup v1 freezer at /sys/fs/cgroup/freezer", false},
		{contain.Host{Kind: contain.KindSystemd, Why: "x"}, "systemd scope in kc-watchman.slice", false},
		{contain.Host{Kind: contain.KindNone, Why: "rootless: containment is root's only"}, "subreaper only: rootless: containment is root's only", true},
	} {
		t.Run(string(tc.host.Kind), func(t *testing.T) {
			c := Containment(tc.host)
			if c.Name != NameContainment || c.Verdict != OK || !strings.HasPrefix(c.Detail, tc.want) || (c.Remedy != "") != tc.remedy {
				t.Errorf("Containment = %+v, want ok %q (remedy %v)", c, tc.want, tc.remedy)
			}
		})
	}
}
