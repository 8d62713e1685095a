// Package contain starts a supervisor tree in a cgroup of its own and
// reaps it from there (DESIGN "Descendants that leave the group"): a
// process group loses a kernel's setsid child and a double-forked daemon,
// a cgroup loses nothing, not even a fork loop once it is frozen.
//
// Where PID 1 is systemd the cgroup is a transient scope asked of systemd
// (a Scoper, over D-Bus); cgroupfs is written directly only without
// systemd: cgroup v2 (a hybrid host's "unified" mount included), else the
// v1 freezer. Without either, or rootless, the wrapper's subreaper is all
// there is.
package contain

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// Kind is the containment a host gives.
type Kind string

// Kinds, as recorded in the ledger and shown by doctor.
const (
	KindSystemd Kind = "systemd"
	KindCgroup2 Kind = "cgroup2"
	KindFreezer Kind = "freezer-v1"
	KindNone    Kind = "none"
)

// Names of kc-watchman's own places in the hierarchies: the cgroupfs
// parent directory, and the systemd slice scopes are started in.
const (
	Dir   = "kc-watchman"
	Slice = "kc-watchman.slice"
)

// Scoper asks the init system for a transient scope (systemd over D-Bus).
type Scoper interface {
	// StartScope moves pid into a new transient scope unit in slice and returns the
	// scope's cgroup path relative to the cgroup mount (systemd's ControlGroup property).
	StartScope(ctx context.Context, unit, slice string, pid int) (cgroup string, err error)
	// StopScope stops the unit (systemd kills what is left and removes the cgroup).
	StopScope(ctx context.Context, unit string) error
	Close() error
}

// Options say where to look and what this build can do.
type Options struct {
	// Systemd connects to systemd; nil: no systemd support is linked, and
	// a host whose PID 1 is systemd gets no cgroup (never a mkdir in the
	// hierarchy systemd manages).
	Systemd func(ctx context.Context) (Scoper, error)
	// Proc is the procfs mount; default /proc.
	Proc string
	// SystemdMarker exists when PID 1 is systemd; default
	// /run/systemd/system (sd_booted's test).
	SystemdMarker string
	// Force, for tests, takes the v1 freezer on a host that has cgroup v2
	// too (never where PID 1 is systemd).
	Force Kind
	// Mounts, when set, is the mount table the cgroups of one decision
	// share; nil reads it at each use.
	Mounts *MountTable
	Logger *slog.Logger
	// euid, for tests, stands in for os.Geteuid.
	euid func() int
}

func (o Options) geteuid() int {
	if o.euid != nil {
		return o.euid()
	}
	return os.Geteuid()
}

func (o Options) withDefaults() Options {
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.SystemdMarker == "" {
		o.SystemdMarker = "/run/systemd/system"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// ErrBadID: a unit or cgroup is named only after a full container ID.
var ErrBadID = errors.New("not a 64-character lowercase hex container ID")

// UnitName is the systemd scope of a container's supervisor.
func UnitName(containerID string) string {
	if !containerid.Valid(containerID) {
		return ""
	}
	return "kc-watchman-" + containerID + ".scope"
}

// Host is the containment this host gives, and why.
type Host struct {
	Kind Kind
	// Mount is the absolute mount point of the hierarchy cgroups are made
	// in (for systemd, the cgroup v2 mount its scopes appear under).
	Mount string
	// Why is for the operator: what was found, or what was missing.
	Why string
	opt Options
}

// String says what Detect found, for logs and doctor.
func (h Host) String() string {
	switch h.Kind {
	case KindSystemd:
		return "systemd scope in " + Slice
	case KindCgroup2:
		return "cgroup v2 at " + h.Mount
	case KindFreezer:
		return "cgroup v1 freezer at " + h.Mount
	}
	return "subreaper only"
}

// Detect finds what containment this host offers a process of this
// euid. It never fails: what it cannot use is KindNone, with Why.
func Detect(opt Options) Host {
	opt = opt.withDefaults()
	h := Host{Kind: KindNone, opt: opt}
	mounts, err := mountsOf(opt)
	if err != nil {
		h.Why = "cannot read the mount table: " + err.Error()
		return h
	}
	v2, fr := mounts.cgroup2(), mounts.freezer()
	_, serr := os.Lstat(opt.SystemdMarker)
	systemd := serr == nil // whatever Force says: never cgroupfs under systemd
	switch {
	case opt.geteuid() != 0 || !initialUserNS():
		// Before systemd's cases: a scope is asked of the system bus,
		// which a rootless caller cannot use.
		h.Why = "rootless: containment is root's only (no cgroup or scope is delegated to this user)"
	case systemd && opt.Systemd == nil:
		h.Why = "PID 1 is systemd and this build has no systemd client: kc-watchman never creates cgroups in a hierarchy systemd manages"
	case systemd && v2 == "":
		h.Why = "PID 1 is systemd but no cgroup v2 hierarchy is mounted to sweep its scopes in"
	case systemd:
		h.Kind, h.Mount, h.Why = KindSystemd, v2, "PID 1 is systemd: a transient scope per supervisor, with Delegate=yes"
	case v2 != "" && opt.Force != KindFreezer:
		h.Kind, h.Mount, h.Why = KindCgroup2, v2, "PID 1 is not systemd: "+Dir+"/<container-id> made there per supervisor, frozen and killed with cgroup.freeze and cgroup.kill"
	case fr != "":
		h.Kind, h.Mount, h.Why = KindFreezer, fr, "PID 1 is not systemd and no cgroup v2 is mounted: "+Dir+"/<container-id> in the v1 freezer, its processes killed one by one while frozen"
	default:
		h.Why = "no systemd, no cgroup v2 and no v1 freezer mounted"
	}
	return h
}

// initialUserNS: root of a user namespace (rootless podman's hook) is not
// root of the host's cgroups. An unreadable map counts as the initial
// one: cgroupfs itself then refuses what the caller may not do.
func initialUserNS() bool {
	m, err := userns.Self()
	return err != nil || m.Initial()
}
