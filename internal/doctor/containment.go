package doctor

import "github.com/kc-watchman/kc-watchman/internal/contain"

// Containment says which containment `kc-hook supervise` gives a
// supervisor on this host, and why (DESIGN "Descendants that leave the
// group"). Without one the subreaper and the descendant walk remain,
// and a daemon of a tree whose wrapper died unseen escapes: worth
// knowing, not a fault.
func Containment(h contain.Host) Check {
	c := newCheck(NameContainment, OK, "%s: %s", h, h.Why)
	if h.Kind == contain.KindNone {
		c.Remedy = "a cgroup v2 or v1 freezer mount (no systemd), or a build with the systemd client (systemd), lets kc-hook supervise contain its supervisors"
	}
	return c
}
