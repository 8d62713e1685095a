// Package packaging holds the tests of the package's maintainer scripts
// that need no dpkg: test/package/deb.sh runs them for real.
package packaging

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unitName matches the janitor's unit names and the shell globs the
// scripts write for them.
var unitName = regexp.MustCompile(`kc-janitor[A-Za-z0-9@?*._-]*\.(?:service|timer)`)

// units are the unit files in dir: their names, and whether each has an
// [Install] section (one an operator can enable).
func units(t *testing.T, dir string) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() || !unitName.MatchString(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = strings.Contains(string(data), "\n[Install]")
	}
	if len(out) == 0 {
		t.Fatalf("no unit files in %s", dir)
	}
	return out
}

// between returns the unit names and globs in the first part of file's
// text that starts with from and ends with to.
func between(t *testing.T, file, from, to string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), from)
	if !ok {
		t.Fatalf("%s: no %q", file, from)
	}
	part, _, ok := strings.Cut(rest, to)
	if !ok {
		t.Fatalf("%s: no %q after %q", file, to, from)
	}
	names := unitName.FindAllString(part, -1)
	if len(names) == 0 {
		t.Fatalf("%s: no unit names between %q and %q", file, from, to)
	}
	return names
}

// covered reports whether one of patterns (shell globs) names unit, or,
// for a template, an instance of it.
func covered(unit string, patterns []string) bool {
	name := unit
	if strings.Contains(unit, "@.") {
		name = strings.Replace(unit, "@.", "@0123abcd.", 1)
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// TestScriptsNameEveryUnit: the maintainer scripts name the units by
// hand. A unit added to contrib/systemd and to the Makefile's lists
// but not to them would keep running after a removal, or stay enabled,
// pointing at nothing, after a purge.
func TestScriptsNameEveryUnit(t *testing.T) {
	system := units(t, "../systemd")
	user := units(t, "../systemd/user")

	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		list  string
		dir   string
		units map[string]bool
	}{
		{"UNITS", "contrib/systemd/", system},
		{"USERUNITS", "contrib/systemd/user/", user},
	} {
		m := regexp.MustCompile(`(?m)^` + tc.list + `\s*:=((?:.*\\\n)*.*)$`).FindSubmatch(makefile)
		if m == nil {
			t.Fatalf("Makefile: no %s", tc.list)
		}
		listed := map[string]bool{}
		for _, f := range strings.Fields(strings.ReplaceAll(string(m[1]), "\\\n", " ")) {
			if name, ok := strings.CutPrefix(f, tc.dir); ok && !strings.Contains(name, "/") {
				listed[name] = true
			}
		}
		for u := range tc.units {
			if !listed[u] {
				t.Errorf("Makefile's %s does not install %s%s", tc.list, tc.dir, u)
			}
		}
		for u := range listed {
			if _, ok := tc.units[u]; !ok {
				t.Errorf("Makefile's %s names %s%s, which does not exist", tc.list, tc.dir, u)
			}
		}
	}

	stopped := between(t, "scripts/prerm", "systemctl stop", ">/dev/null")
	noted := between(t, "scripts/prerm", "for unit in", "; do")
	restarted := between(t, "scripts/postinst", "continue ;;", ") ;;")
	unlinked := between(t, "scripts/postrm", "for link in", "; do")
	for u, enableable := range system {
		if !covered(u, stopped) {
			t.Errorf("prerm does not stop %s on removal (it stops %v)", u, stopped)
		}
		if !covered(u, unlinked) {
			t.Errorf("postrm does not drop the links enabling %s on purge (it drops %v)", u, unlinked)
		}
		// A unit of its own accord (a timer, the watch service) is
		// noted when stopped and started again on a reinstall; one a
		// timer starts (no [Install]) is left to its timer.
		if enableable && !covered(u, noted) {
			t.Errorf("prerm does not note %s as stopped (it notes %v)", u, noted)
		}
		if enableable && !covered(u, restarted) {
			t.Errorf("postinst does not start %s again after an aborted removal (it starts %v)", u, restarted)
		}
	}
	for u := range user {
		if !covered(u, unlinked) {
			t.Errorf("postrm does not drop the links enabling the user unit %s on purge (it drops %v)", u, unlinked)
		}
	}
}
