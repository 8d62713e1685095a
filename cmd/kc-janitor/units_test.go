package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

var units = []string{"kc-janitor.service", "kc-janitor.timer", "kc-janitor-watch.service",
	"kc-janitor-container@.service", "kc-janitor-container@.timer"}

// instance names a template unit's instance (a container name) so that
// systemd-analyze and the command lines see what systemd would run.
func instance(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "@.", "@positron-server."), "%i", "positron-server")
}

const unitDir = "../../contrib/systemd"

// TestUnitsVerify runs systemd-analyze verify on the units, with ExecStart
// pointing at an existing executable as `make install` rewrites it.
func TestUnitsVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, u := range units {
		data, err := os.ReadFile(filepath.Join(unitDir, u))
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(strings.ReplaceAll(string(data), "/usr/local/bin/kc-janitor", self))
		if err := os.WriteFile(filepath.Join(dir, instance(u)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"verify", "--man=no"}
	for _, u := range units {
		args = append(args, filepath.Join(dir, instance(u)))
	}
	out, err := exec.Command(sa, args...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestUnitsCommandLines: every ExecStart is a valid kc-janitor command
// line, and the timer's service runs in audit mode.
func TestUnitsCommandLines(t *testing.T) {
	// A command line of its own, or one of several a shell runs in turn
	// ("$$1" being the instance).
	exec := regexp.MustCompile(`(?m)(?:^ExecStart=|'|; )/usr/local/bin/kc-janitor ([^;'&\n]*)`)
	for _, u := range units {
		if !strings.HasSuffix(u, ".service") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(unitDir, u))
		if err != nil {
			t.Fatal(err)
		}
		ms := exec.FindAllStringSubmatch(strings.ReplaceAll(instance(string(data)), `"$$1"`, "positron-server"), -1)
		if want := strings.Count(string(data), "/usr/local/bin/kc-janitor "); len(ms) != want {
			t.Errorf("%s: %d kc-janitor command lines read, of %d", u, len(ms), want)
		}
		if ms == nil {
			t.Errorf("%s: no ExecStart=/usr/local/bin/kc-janitor (make install rewrites that path)", u)
			continue
		}
		for _, m := range ms {
			args := strings.Fields(m[1])
			for _, a := range args {
				if strings.Contains(a, "apply") {
					t.Errorf("%s: %q: the shipped units must audit, not apply", u, a)
				}
			}
			if code, out := runJanitorCapture(t, append(args, "--help")...); code != exitOK {
				t.Errorf("%s: kc-janitor %s: exit %d: %s", u, m[1], code, out)
			}
		}
	}
}

// TestEnvFileNamesRealVariables: every KC_ variable the settings file
// offers is one a flag reads.
func TestEnvFileNamesRealVariables(t *testing.T) {
	known := map[string]bool{}
	app := newApp()
	for _, f := range app.Flags {
		for _, e := range flagEnvVars(f) {
			known[e] = true
		}
	}
	for _, c := range app.Commands {
		for _, f := range c.Flags {
			for _, e := range flagEnvVars(f) {
				known[e] = true
			}
		}
	}
	f, err := os.Open(filepath.Join(unitDir, "kc-janitor.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^#?(KC_[A-Z_]+)=`)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := re.FindStringSubmatch(line); m != nil {
			n++
			if !known[m[1]] {
				t.Errorf("kc-janitor.env offers %s, which no flag reads", m[1])
			}
			if !strings.HasPrefix(line, "#") {
				t.Errorf("kc-janitor.env sets %s: the shipped file must change nothing", m[1])
			}
		}
	}
	if n == 0 {
		t.Error("no variables found")
	}
}

func flagEnvVars(f any) []string {
	if e, ok := f.(interface{ GetEnvVars() []string }); ok {
		return e.GetEnvVars()
	}
	return nil
}

// TestMakeInstallDestdir: `make install-units install-man
// install-completion` into a DESTDIR, with another PREFIX, puts every file
// in place with the binary path rewritten, and never overwrites the
// operator's settings file.
func TestMakeInstallDestdir(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	bin := filepath.Join(t.TempDir(), "kc-janitor")
	if err := testutil.GoBuild(".", bin); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	settings := filepath.Join(dest, "opt/etc/default/kc-janitor")
	os.MkdirAll(filepath.Dir(settings), 0o755)
	os.WriteFile(settings, []byte("KC_APPLY=1\n"), 0o644)
	install := func(targets ...string) ([]byte, error) {
		args := append([]string{"-C", "../.."}, targets...)
		return exec.Command(mk, append(args, "DESTDIR="+dest, "PREFIX=/opt/kc", "SYSCONFDIR=/opt/etc", "JANITOR="+bin)...).CombinedOutput()
	}
	// No descriptor before the kc-hook it names.
	if out, err := install("install-hooks"); err == nil || !strings.Contains(string(out), "kc-hook is not installed") {
		t.Errorf("install-hooks without kc-hook: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dest, "usr/share/containers/oci/hooks.d/kc-hook-poststop.json")); err == nil {
		t.Error("a descriptor was installed naming a kc-hook that is not there")
	}
	hook := filepath.Join(dest, "opt/kc/libexec/oci/hooks.d/kc-hook")
	os.MkdirAll(filepath.Dir(hook), 0o755)
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := install("install-units", "install-man", "install-completion", "install-hooks"); err != nil {
		t.Fatalf("make: %v\n%s", err, out)
	}
	if left, _ := filepath.Glob(filepath.Join(dest, "usr/share/containers/oci/hooks.d/.*")); len(left) > 0 {
		t.Errorf("temporary files left beside the descriptors: %v", left)
	}
	for _, f := range []string{
		"opt/kc/lib/systemd/system/kc-janitor.service", "opt/kc/lib/systemd/system/kc-janitor.timer",
		"opt/kc/lib/systemd/system/kc-janitor-watch.service",
		"opt/kc/lib/systemd/system/kc-janitor-container@.service", "opt/kc/lib/systemd/system/kc-janitor-container@.timer", "opt/kc/share/man/man8/kc-janitor.8",
		"opt/kc/share/bash-completion/completions/kc-janitor", "opt/kc/share/zsh/site-functions/_kc-janitor",
	} {
		data, err := os.ReadFile(filepath.Join(dest, f))
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if strings.Contains(string(data), "/usr/local/bin") {
			t.Errorf("%s still names /usr/local/bin", f)
		}
		if strings.HasSuffix(f, ".service") && !strings.Contains(string(data), "/opt/kc/bin/kc-janitor ") {
			t.Errorf("%s: ExecStart not rewritten", f)
		}
		if strings.Contains(string(data), "EnvironmentFile=") && !strings.Contains(string(data), "EnvironmentFile=-/opt/etc/default/kc-janitor\n") {
			t.Errorf("%s: EnvironmentFile does not name SYSCONFDIR's settings", f)
		}
	}
	// The descriptors go where podman reads them, whatever PREFIX is.
	desc, err := os.ReadFile(filepath.Join(dest, "usr/share/containers/oci/hooks.d/kc-hook-poststop.json"))
	if err != nil {
		t.Errorf("descriptor not where podman looks: %v", err)
	} else if !strings.Contains(string(desc), `"/opt/kc/libexec/oci/hooks.d/kc-hook"`) {
		t.Errorf("descriptor's path not rewritten to the installed hook:\n%s", desc)
	}
	if _, err := os.Stat(filepath.Join(dest, "opt/kc/share/containers")); err == nil {
		t.Error("descriptors installed under PREFIX, where podman never looks")
	}
	if data, _ := os.ReadFile(settings); string(data) != "KC_APPLY=1\n" {
		t.Errorf("make install overwrote the operator's settings: %q", data)
	}
}

// TestUnitsMemoryMax: every service, system and user, bounds its memory,
// above what a round was measured to peak at when every socket it probed
// answered with bodies over their caps (108 MiB, docs/RELIABILITY.md).
func TestUnitsMemoryMax(t *testing.T) {
	re := regexp.MustCompile(`(?m)^MemoryMax=(\d+)M$`)
	for p, data := range serviceUnits(t) {
		m := re.FindSubmatch(data)
		if m == nil {
			t.Errorf("%s: no MemoryMax=<n>M", p)
			continue
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 200 {
			t.Errorf("%s: MemoryMax=%dM, under the 108 MiB a round was measured at plus slack", p, n)
		}
	}
}

// serviceUnits reads every service unit, system and user: path, text.
func serviceUnits(t *testing.T) map[string][]byte {
	t.Helper()
	services, err := filepath.Glob(filepath.Join(unitDir, "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	user, err := filepath.Glob(filepath.Join(unitDir, "user", "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, p := range append(services, user...) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = data
	}
	if len(out) == 0 {
		t.Fatalf("no service units in %s", unitDir)
	}
	return out
}

// TestOneshotUnitsTimeout: every oneshot service, system and user, ends
// a round held for ever (systemd sets no start timeout for a oneshot, and
// its timer would start no other), with room for the deadlines a round
// keeps on its own.
func TestOneshotUnitsTimeout(t *testing.T) {
	re := regexp.MustCompile(`(?m)^TimeoutStartSec=(\d+)min$`)
	oneshot := regexp.MustCompile(`(?m)^Type=oneshot$`)
	oneshots := 0
	for p, data := range serviceUnits(t) {
		if !oneshot.Match(data) {
			continue
		}
		oneshots++
		m := re.FindSubmatch(data)
		if m == nil {
			t.Errorf("%s: a oneshot without TimeoutStartSec=<n>min", p)
			continue
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 5 {
			t.Errorf("%s: TimeoutStartSec=%dmin, too short for a round's own deadlines", p, n)
		}
	}
	if oneshots < 3 {
		t.Errorf("%d oneshot services found, want the system, container and user rounds", oneshots)
	}
}

// TestMakeInstallRefusesStaleBinaries: `make install` copies bin/ without
// building it (sudo's PATH has no Go), so binaries of another commit than
// the tree's are refused; where git cannot tell (VERSION dev), they pass.
func TestMakeInstallRefusesStaleBinaries(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	makefile, err := filepath.Abs("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"kc-hook", "kc-janitor"} {
		if err := os.WriteFile(filepath.Join(dir, "bin", b), []byte("#!/bin/sh\necho "+b+" abc1234\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		version string
		ok      bool
	}{{"abc1234", true}, {"dev", true}, {"def5678", false}, {"abc1234-dirty", false}} {
		out, err := exec.Command(mk, "-s", "-f", makefile, "-C", dir, "built", "VERSION="+tc.version).CombinedOutput()
		if (err == nil) != tc.ok || (!tc.ok && !strings.Contains(string(out), "bin/kc-hook is version abc1234, this tree is "+tc.version+": run 'make build' first")) {
			t.Errorf("VERSION=%s: %v\n%s", tc.version, err, out)
		}
	}
}

// TestMakeUninstallAndThePackage: install-hooks does not replace a
// descriptor of the same name that runs another kc-hook (the package's),
// unless FORCE=1; uninstall refuses while a file the runtimes read still
// names the kc-hook it deletes (containerd's base spec), and removes only
// the descriptors naming it.
func TestMakeUninstallAndThePackage(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	dest := t.TempDir()
	run := func(args ...string) ([]byte, error) {
		args = append([]string{"-C", "../.."}, args...)
		return exec.Command(mk, append(args, "DESTDIR="+dest, "PREFIX=/opt/kc")...).CombinedOutput()
	}
	write := func(rel, data string) string {
		p := filepath.Join(dest, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hook := write("opt/kc/libexec/oci/hooks.d/kc-hook", "#!/bin/sh\n")
	const pkgDesc = `{"version": "1.0.0", "hook": {"path": "/usr/libexec/kc-watchman/kc-hook"}}`
	stop := write("usr/share/containers/oci/hooks.d/kc-hook-poststop.json", pkgDesc)

	if out, err := run("install-hooks"); err == nil || !strings.Contains(string(out), "runs another kc-hook") {
		t.Errorf("install-hooks over the package's descriptor: %v\n%s", err, out)
	}
	if data, _ := os.ReadFile(stop); string(data) != pkgDesc {
		t.Errorf("the package's descriptor was replaced: %s", data)
	}
	if out, err := run("uninstall"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if data, _ := os.ReadFile(stop); string(data) != pkgDesc {
		t.Errorf("uninstall removed the package's descriptor: %s", data)
	}

	write("opt/kc/libexec/oci/hooks.d/kc-hook", "#!/bin/sh\n")
	if out, err := run("install-hooks", "FORCE=1"); err != nil {
		t.Fatalf("install-hooks FORCE=1: %v\n%s", err, out)
	}
	spec := write("etc/containerd/kc-watchman-base-spec.json", `{"hooks": {"poststop": [{"path": "/opt/kc/libexec/oci/hooks.d/kc-hook"}]}}`)
	if out, err := run("uninstall"); err == nil || !strings.Contains(string(out), spec) {
		t.Errorf("uninstall while containerd's base spec names the hook: %v\n%s", err, out)
	}
	if _, err := os.Stat(hook); err != nil {
		t.Errorf("the hook containerd still runs was removed: %v", err)
	}
	os.Remove(spec)
	if out, err := run("uninstall"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	for _, p := range []string{hook, stop} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left after uninstall", p)
		}
	}
}

// TestContainerUnitMetricsFile: the container unit's runs write their
// metrics to a file of the instance's own beside KC_METRICS_FILE, where
// they cannot overwrite the host's sweep's gauges; without the variable,
// none.
func TestContainerUnitMetricsFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(unitDir, "kc-janitor-container@.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ExecStart=/bin/sh -c '(.*)' sh %i$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no ExecStart=/bin/sh -c '…' sh %i")
	}
	// systemd's unescaping of what it hands the shell.
	script := strings.NewReplacer("$$", "$", "%%", "%").Replace(string(m[1]))
	fake := filepath.Join(t.TempDir(), "kc-janitor")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$1 ${KC_METRICS_FILE:-none}\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script = strings.ReplaceAll(script, "/usr/local/bin/kc-janitor", fake)
	for _, tc := range []struct{ env, want string }{
		{"KC_METRICS_FILE=/m/kc-janitor.prom", "sweep /m/kc-janitor-positron.prom\ncull /m/kc-janitor-positron.prom\n"},
		{"KC_OTHER=1", "sweep none\ncull none\n"},
	} {
		cmd := exec.Command("/bin/sh", "-c", script, "sh", "positron")
		cmd.Env = []string{tc.env, "PATH=/usr/bin:/bin"}
		out, err := cmd.Output()
		if err != nil || string(out) != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.env, out, err, tc.want)
		}
	}
}
