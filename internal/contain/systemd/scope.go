package systemd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/godbus/dbus/v5"
)

// D-Bus errors systemd answers with that callers act on.
const (
	errNameUnitExists = "org.freedesktop.systemd1.UnitExists"
	errNameNoSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"
)

// ErrUnitExists is wrapped by StartScope's error when systemd already has a
// unit of that name: the scope is someone else's, or an earlier one of ours
// not yet collected.
var ErrUnitExists = errors.New("unit already exists")

// property is one (sv) of StartTransientUnit's a(sv).
type property struct {
	Name  string
	Value dbus.Variant
}

// auxUnit is one (sa(sv)) of StartTransientUnit's a(sa(sv)); none are sent,
// but the empty array must still carry its signature.
type auxUnit struct {
	Name  string
	Props []property
}

// scopeProperties are the properties of the scope for pid, with the D-Bus
// types systemd's transient-unit parser requires (org.freedesktop.systemd1(5)).
func scopeProperties(slice string, pid int) []property {
	return []property{
		{"Description", dbus.MakeVariant(fmt.Sprintf("kc-watchman supervised tree of pid %d", pid))},
		{"Slice", dbus.MakeVariant(slice)},
		// The subtree is ours: systemd leaves the scope's cgroup to the
		// caller to freeze and kill, as it does for runc's and podman's.
		{"Delegate", dbus.MakeVariant(true)},
		{"PIDs", dbus.MakeVariant([]uint32{uint32(pid)})},
		// A failed scope is garbage-collected too, so its name is free for
		// the next start and nothing lingers in systemctl's list.
		{"CollectMode", dbus.MakeVariant("inactive-or-failed")},
	}
}

// StartScope has systemd start the transient scope unit in slice and move
// pid into it, waits for the start job to finish, and returns the scope's
// cgroup path relative to the cgroup mount (its ControlGroup property),
// checked to be the scope's directory in the slice's. An error after the
// job finished leaves the scope to systemd; StopScope ends it.
func (m *Manager) StartScope(ctx context.Context, unit, slice string, pid int) (string, error) {
	if err := CheckScopeName(unit); err != nil {
		return "", err
	}
	if err := CheckSliceName(slice); err != nil {
		return "", err
	}
	if pid < 2 || pid > math.MaxInt32 {
		return "", fmt.Errorf("starting scope %s: pid %d cannot be moved into a scope", unit, pid)
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	result, err := m.runJob(ctx, "StartTransientUnit", unit,
		unit, "fail", scopeProperties(slice, pid), []auxUnit{})
	if err != nil {
		var derr dbus.Error
		if errors.As(err, &derr) && derr.Name == errNameUnitExists {
			return "", fmt.Errorf("starting scope %s: systemd already has a unit of that name: %w", unit, ErrUnitExists)
		}
		return "", fmt.Errorf("starting scope %s in %s for pid %d: %w", unit, slice, pid, err)
	}
	if result != "done" {
		return "", fmt.Errorf("systemd could not start scope %s in %s for pid %d: its job ended %q (journalctl -u %s says why)",
			unit, slice, pid, result, unit)
	}
	cg, err := m.controlGroup(ctx, unit)
	if err != nil {
		return "", fmt.Errorf("scope %s started, but its cgroup is unknown: %w", unit, err)
	}
	if err := checkControlGroup(cg, unit, slice); err != nil {
		return "", fmt.Errorf("refusing scope %s: %w", unit, err)
	}
	return cg, nil
}

// StopScope has systemd stop the scope unit, which kills what is left in it
// and removes its cgroup, and waits for the stop job. A unit systemd no
// longer has is already stopped.
func (m *Manager) StopScope(ctx context.Context, unit string) error {
	if err := CheckScopeName(unit); err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	result, err := m.runJob(ctx, "StopUnit", unit, unit, "replace")
	if err != nil {
		var derr dbus.Error
		if errors.As(err, &derr) && derr.Name == errNameNoSuchUnit {
			return nil
		}
		return fmt.Errorf("stopping scope %s: %w", unit, err)
	}
	if result != "done" {
		return fmt.Errorf("systemd could not stop scope %s: its job ended %q (journalctl -u %s says why)", unit, result, unit)
	}
	return nil
}

// runJob calls a Manager method that queues a job and returns the job's
// result from systemd's JobRemoved signal: "done", or "canceled",
// "timeout", "failed", "dependency", "skipped".
func (m *Manager) runJob(ctx context.Context, method, unit string, args ...any) (string, error) {
	// Only the bus name's owner speaks for systemd: a JobRemoved from any
	// other connection is ignored.
	var owner string
	err := m.conn.BusObject().CallWithContext(ctx, "org.freedesktop.DBus.GetNameOwner", 0, busName).Store(&owner)
	if err != nil {
		return "", fmt.Errorf("systemd is not on the bus: %w", err)
	}
	if !strings.HasPrefix(owner, ":") {
		return "", fmt.Errorf("the bus names %q as systemd's connection, not a unique name", owner)
	}
	// Listen before calling: the job may end, and its signal arrive,
	// before the method's reply.
	signals := make(chan *dbus.Signal, 16)
	m.conn.Signal(signals)
	defer m.conn.RemoveSignal(signals)

	var job dbus.ObjectPath
	err = m.conn.Object(busName, managerPath).CallWithContext(ctx, managerIf+"."+method, 0, args...).Store(&job)
	if err != nil {
		return "", err
	}
	if !job.IsValid() || job == "/" {
		return "", fmt.Errorf("systemd answered %s with job path %q", method, job)
	}
	for {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for systemd's job %s on %s: %w", job, unit, ctx.Err())
		case s, ok := <-signals:
			if !ok {
				return "", fmt.Errorf("waiting for systemd's job %s on %s: the D-Bus connection closed", job, unit)
			}
			if s.Sender != owner || s.Path != managerPath || s.Name != managerIf+".JobRemoved" {
				continue
			}
			var (
				id      uint32
				path    dbus.ObjectPath
				jobUnit string
				result  string
			)
			if dbus.Store(s.Body, &id, &path, &jobUnit, &result) != nil || path != job {
				continue
			}
			if jobUnit != unit {
				return "", fmt.Errorf("systemd's job %s ran on %q, not %s", job, jobUnit, unit)
			}
			return result, nil
		}
	}
}

// controlGroup reads the scope's ControlGroup property.
func (m *Manager) controlGroup(ctx context.Context, unit string) (string, error) {
	var path dbus.ObjectPath
	err := m.conn.Object(busName, managerPath).CallWithContext(ctx, managerIf+".GetUnit", 0, unit).Store(&path)
	if err != nil {
		var derr dbus.Error
		if errors.As(err, &derr) && derr.Name == errNameNoSuchUnit {
			return "", fmt.Errorf("systemd no longer has %s (did its processes exit at once?): %w", unit, err)
		}
		return "", err
	}
	if !path.IsValid() || path == "/" {
		return "", fmt.Errorf("systemd answered GetUnit with object path %q", path)
	}
	var v dbus.Variant
	err = m.conn.Object(busName, path).CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0,
		"org.freedesktop.systemd1.Scope", "ControlGroup").Store(&v)
	if err != nil {
		return "", err
	}
	cg, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("systemd's ControlGroup of %s has type %s, not a string", unit, v.Signature())
	}
	if cg == "" {
		return "", fmt.Errorf("systemd reports no cgroup for %s", unit)
	}
	return cg, nil
}
