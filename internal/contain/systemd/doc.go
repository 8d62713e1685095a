// Package systemd asks systemd, over D-Bus, for the transient scope that
// contains a supervised tree (DESIGN "Descendants that leave the group").
//
// Where PID 1 is systemd, systemd owns the cgroup hierarchy: a directory
// made there with mkdir is one systemd does not know, may move processes
// out of, and may remove on its next realisation. So kc-hook supervise does
// what runc and podman do: it calls StartTransientUnit for a scope in
// kc-watchman.slice with Delegate=yes, which makes systemd move the
// supervisor into the scope's cgroup and hand that cgroup's subtree to us.
// The caller then freezes, kills and reads the scope through cgroupfs as it
// would a cgroup of its own, and stops the unit to have systemd remove it.
//
// The client is deliberately small (godbus alone, not go-systemd) because
// kc-hook links it and the hook's dependency set is kept lean. Every call is
// bounded by its context, a job counts as finished only on systemd's own
// JobRemoved signal, and the cgroup path systemd reports is checked to lie
// where the scope was asked to go before anyone writes to it.
//
// The machines this project is tested on do not run systemd as PID 1: the
// tests talk to a D-Bus double (a private dbus-daemon and a fake
// org.freedesktop.systemd1 Manager in the test process). They pin the
// method, property names and D-Bus types systemd documents; the real
// systemd path is not exercised there.
package systemd
