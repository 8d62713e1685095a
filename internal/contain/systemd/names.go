package systemd

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// unitNameMax is systemd's UNIT_NAME_MAX less its terminating NUL.
const unitNameMax = 255

// checkName refuses a unit name systemd would reject or escape, before it
// reaches the bus. Only the characters systemd allows unescaped, without
// the template '@' and the escape '\', are accepted; the first must be a
// letter or digit, so the name is its own cgroup directory name (systemd
// prefixes names beginning with '_' or '.' with another '_').
func checkName(name, suffix string) error {
	if len(name) > unitNameMax {
		return fmt.Errorf("unit name %.40q... is longer than systemd's %d characters", name, unitNameMax)
	}
	prefix, ok := strings.CutSuffix(name, suffix)
	if !ok || prefix == "" {
		return fmt.Errorf("unit name %q: want a name ending in %q", name, suffix)
	}
	for i, c := range []byte(prefix) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("unit name %q: must begin with a letter or digit", name)
		}
		if !alnum && c != ':' && c != '_' && c != '.' && c != '-' {
			return fmt.Errorf("unit name %q: character %q is not one of [A-Za-z0-9:_.-]", name, c)
		}
	}
	return nil
}

// CheckScopeName reports whether name is a scope name this package will
// send to systemd.
func CheckScopeName(name string) error { return checkName(name, ".scope") }

// CheckSliceName reports whether name is a slice name this package will
// send to systemd. Dashes in a slice name are its place in the tree
// (systemd.slice(5)), so none may lead, trail or double.
func CheckSliceName(name string) error {
	if err := checkName(name, ".slice"); err != nil {
		return err
	}
	prefix := strings.TrimSuffix(name, ".slice")
	if strings.HasSuffix(prefix, "-") || strings.Contains(prefix, "--") {
		return fmt.Errorf("slice name %q: a dash separates parent slices and may not trail or double", name)
	}
	return nil
}

// SlicePath is the cgroup path, relative to the service manager's root,
// of a slice: systemd nests "a-b.slice" inside "a.slice", so
// kc-watchman.slice is /kc.slice/kc-watchman.slice.
func SlicePath(slice string) (string, error) {
	if err := CheckSliceName(slice); err != nil {
		return "", err
	}
	parts := strings.Split(strings.TrimSuffix(slice, ".slice"), "-")
	var b strings.Builder
	for i := range parts {
		b.WriteString("/" + strings.Join(parts[:i+1], "-") + ".slice")
	}
	return b.String(), nil
}

// errOutside marks a ControlGroup that is not the scope asked for.
var errOutside = errors.New("not the scope's cgroup in its slice")

// checkControlGroup accepts a ControlGroup property only if it is the
// scope's own cgroup in the slice asked for: absolute, clean, ending in the
// slice's path and the scope's name. The part before is the manager's own
// root (empty for the system manager, user@UID.service's cgroup for a
// user manager). Each name may carry the '_' systemd's cgroup escaping
// adds to names that clash with kernel files (cpu.scope is _cpu.scope).
func checkControlGroup(cg, unit, slice string) error {
	if len(cg) > 4096 {
		return fmt.Errorf("ControlGroup of %s is %d bytes long: %w", unit, len(cg), errOutside)
	}
	if !strings.HasPrefix(cg, "/") || strings.ContainsRune(cg, 0) || path.Clean(cg) != cg {
		return fmt.Errorf("ControlGroup %q of %s is not an absolute, clean path: %w", cg, unit, errOutside)
	}
	slicePath, err := SlicePath(slice)
	if err != nil {
		return err
	}
	want := append(strings.Split(slicePath[1:], "/"), unit)
	got := strings.Split(cg[1:], "/")
	if len(got) < len(want) {
		return fmt.Errorf("ControlGroup %q of %s is not under %s: %w", cg, unit, slicePath, errOutside)
	}
	got = got[len(got)-len(want):]
	for i := range want {
		if got[i] != want[i] && got[i] != "_"+want[i] {
			return fmt.Errorf("ControlGroup %q of %s is not %s/%s: %w", cg, unit, slicePath, unit, errOutside)
		}
	}
	return nil
}
