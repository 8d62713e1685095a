package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
)

// optionLine is a line of an options list: the flag's first name.
var optionLine = regexp.MustCompile(`^   --([a-z0-9-]+)`)

// listedFlags are the flags a help text lists as options.
func listedFlags(help string) []string {
	var out []string
	for _, l := range strings.Split(help, "\n") {
		if m := optionLine.FindStringSubmatch(l); m != nil {
			out = append(out, m[1])
		}
	}
	return out
}

// globalNames are the flags kc-janitor --help describes once.
func globalNames() []string {
	var out []string
	for _, f := range newApp().VisibleFlags() {
		if n := f.Names()[0]; n != "help" && n != "version" {
			out = append(out, n)
		}
	}
	return out
}

// TestHelpReadable: every help text fits 80 columns; the global options
// are listed in kc-janitor --help only, every command's help points
// there, and a command lists only the options it reads.
func TestHelpReadable(t *testing.T) {
	globals := globalNames()
	if len(globals) < 10 {
		t.Fatalf("global flags %q", globals)
	}
	for _, tc := range []struct {
		args []string
		// want and never are options the help must and must not list.
		want, never []string
	}{
		{[]string{"--help"}, globals, []string{"apply", "min-age"}},
		{[]string{"help"}, globals, nil},
		{[]string{"reconcile", "--help"}, []string{"apply", "min-age", "kill-grace", "container", "bpf"}, globals},
		{[]string{"help", "reconcile"}, []string{"apply", "kill-grace"}, globals},
		{[]string{"reconcile", "help"}, []string{"apply", "kill-grace"}, globals},
		{[]string{"status", "h"}, []string{"min-age"}, globals},
		{[]string{"sweep", "--help"}, []string{"apply", "socket-dir", "hashed-min-age", "container"}, append([]string{"container-pid"}, globals...)},
		{[]string{"cull", "-h"}, []string{"idle", "socket", "socket-dir"}, globals},
		{[]string{"doctor", "--help"}, []string{"fix", "hooks-dir", "kill-grace"}, globals},
		{[]string{"status", "--help"}, []string{"min-age", "container", "socket-dir"}, append([]string{"kill-grace", "apply"}, globals...)},
		{[]string{"watch", "--help"}, []string{"interval", "reconcile-apply", "kill-grace"}, globals},
		{[]string{"version", "--help"}, nil, globals},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out := runJanitorCapture(t, tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			for i, l := range strings.Split(out, "\n") {
				if len(l) > cliapp.HelpWidth {
					t.Errorf("line %d is %d columns: %q", i+1, len(l), l)
				}
			}
			listed := listedFlags(out)
			for _, f := range tc.want {
				if !slices.Contains(listed, f) {
					t.Errorf("--%s not listed:\n%s", f, out)
				}
			}
			for _, f := range tc.never {
				if slices.Contains(listed, f) {
					t.Errorf("--%s listed:\n%s", f, out)
				}
			}
			if app := tc.args[0] == "--help" || len(tc.args) == 1; !app {
				if !strings.Contains(out, "See kc-janitor --help (--format,") {
					t.Errorf("no pointer to the global options:\n%s", out)
				}
			}
		})
	}
}

// TestGlobalFlagsAfterCommand: a global flag hidden from a command's help
// is still taken after the command name, and --kill-grace, which status
// does not list, is still accepted there.
func TestGlobalFlagsAfterCommand(t *testing.T) {
	socks := t.TempDir()
	for _, args := range [][]string{
		{"version", "--format", "json"},
		{"sweep", "--socket-dir", socks, "--format", "json", "--log-level", "error", "--engine", "docker"},
		{"status", "--socket-dir", socks, "--kill-grace", "3s", "--state-dir", t.TempDir(), "--engine", "docker", "--docker-url", "unix:///nonexistent/docker.sock", "--format", "json"},
	} {
		code, out := runJanitorCapture(t, args...)
		if code != exitOK || !strings.HasPrefix(strings.TrimSpace(out), "{") {
			t.Errorf("%q: exit %d:\n%s", args, code, out)
		}
	}
}

// TestManPageGlobalsOnce: the man page describes each global option once.
func TestManPageGlobalsOnce(t *testing.T) {
	_, out := runJanitorCapture(t, "man")
	for _, g := range globalNames() {
		// An option's paragraph starts with its name in bold.
		bold := `\fB` + strings.ReplaceAll("--"+g, "-", `\-`)
		if n := len(regexp.MustCompile(regexp.QuoteMeta(bold)+`(?:[ ,]|\\fR)`).FindAllString(out, -1)); n != 1 {
			t.Errorf("--%s described %d times in the man page", g, n)
		}
	}
}
