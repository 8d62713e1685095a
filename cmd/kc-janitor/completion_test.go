package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/cliapp"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// janitorBinary builds kc-janitor once for the tests that need the real
// binary (the completion scripts run it); TestMain removes it.
func janitorBinary(t *testing.T) string {
	t.Helper()
	return testutil.Build(t, testutil.KCJanitorPackage, "kc-janitor")
}

// shellOrSkip finds a shell; without it the test is skipped, unless
// KC_E2E=1 asks for every test to run.
func shellOrSkip(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("KC_E2E") == "1" {
			t.Fatalf("%s not installed (KC_E2E=1): apt-get install %s", name, name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// tab sources the generated script of shell in a fresh shell, sets up the
// words typed (the last one is under the cursor) as the shell's completion
// system would, calls the completion function and returns the candidates
// it offered. "__files__" stands for zsh's file completion.
func tab(t *testing.T, shell, bin string, words ...string) []string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "completion")
	code, out := runJanitorCapture(t, "completion", shell)
	if code != exitOK {
		t.Fatalf("completion %s: exit %d", shell, code)
	}
	if err := os.WriteFile(script, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	quoted := []string{shQuote(bin)}
	for _, w := range words {
		quoted = append(quoted, shQuote(w))
	}
	var prog string
	switch shell {
	case "bash":
		prog = `source "$1"
COMP_WORDS=(` + strings.Join(quoted, " ") + `)
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_kc_janitor
printf '%s\n' "${COMPREPLY[@]}"`
	case "zsh":
		prog = `compdef() { :; }
compadd() { [[ $1 == -- ]] && shift; printf '%s\n' "$@"; }
_files() { print -r -- __files__; }
source "$1"
words=(` + strings.Join(quoted, " ") + `)
CURRENT=${#words}
_kc_janitor`
	}
	args := []string{"-c", prog, "sh", script}
	if shell == "zsh" {
		args = append([]string{"-f"}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shellOrSkip(t, shell), args...)
	cmd.Dir = t.TempDir()
	res, err := cmd.Output()
	if ctx.Err() != nil {
		t.Fatalf("%s: TAB after %q did not return in 20s: it ran the command", shell, words)
	}
	if err != nil {
		t.Fatalf("%s: %v", shell, err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(res)), "\n") {
		if l != "" {
			got = append(got, l)
		}
	}
	return got
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func TestCompletionScripts(t *testing.T) {
	bin := janitorBinary(t)
	for _, shell := range []string{"bash", "zsh"} {
		t.Run(shell, func(t *testing.T) {
			t.Run("commands", func(t *testing.T) {
				got := tab(t, shell, bin, "")
				for _, want := range []string{"reconcile", "sweep", "cull", "doctor", "status", "watch", "version"} {
					if !slices.Contains(got, want) {
						t.Errorf("TAB offers %q, not %s", got, want)
					}
				}
				for _, never := range []string{"help", "h", "man", "completion"} {
					if slices.Contains(got, never) {
						t.Errorf("TAB offers %s: %q", never, got)
					}
				}
			})
			t.Run("prefix", func(t *testing.T) {
				if got := tab(t, shell, bin, "rec"); !slices.Equal(got, []string{"reconcile"}) {
					t.Errorf("rec<TAB> = %q", got)
				}
			})
			t.Run("flags", func(t *testing.T) {
				got := tab(t, shell, bin, "reconcile", "--")
				for _, want := range []string{"--apply", "--min-age", "--format", "--log-level", "--help"} {
					if !slices.Contains(got, want) {
						t.Errorf("reconcile --<TAB> lacks %s: %q", want, got)
					}
				}
			})
			t.Run("values", func(t *testing.T) {
				if got := tab(t, shell, bin, "sweep", "--format", ""); !slices.Equal(got, []string{"text", "json"}) {
					t.Errorf("--format <TAB> = %q", got)
				}
				if got := tab(t, shell, bin, "reconcile", "--bpf", "o"); !slices.Equal(got, []string{"on", "off"}) {
					t.Errorf("--bpf o<TAB> = %q", got)
				}
				if got := tab(t, shell, bin, "reconcile", "--engine", "d"); !slices.Equal(got, []string{"docker"}) {
					t.Errorf("--engine d<TAB> = %q", got)
				}
				if got := tab(t, shell, bin, "--log-level", "w"); !slices.Equal(got, []string{"warn"}) {
					t.Errorf("--log-level w<TAB> = %q", got)
				}
				// A list: the engines not named yet, after those that are.
				if got := tab(t, shell, bin, "reconcile", "--engine", "podman,"); !slices.Equal(got, []string{"podman,docker", "podman,containerd", "podman,cri"}) {
					t.Errorf("--engine podman,<TAB> = %q", got)
				}
				if got := tab(t, shell, bin, "reconcile", "--engine", "podman,docker,c"); !slices.Equal(got, []string{"podman,docker,containerd", "podman,docker,cri"}) {
					t.Errorf("--engine podman,docker,c<TAB> = %q", got)
				}
				// auto stands alone: nothing follows it.
				if got := tab(t, shell, bin, "reconcile", "--engine", "auto,"); len(got) != 0 && !slices.Equal(got, []string{"__files__"}) {
					t.Errorf("--engine auto,<TAB> = %q", got)
				}
			})
			t.Run("files", func(t *testing.T) {
				got := tab(t, shell, bin, "reconcile", "--metrics-file", "")
				if shell == "zsh" && !slices.Equal(got, []string{"__files__"}) || shell == "bash" && len(got) != 0 {
					t.Errorf("--metrics-file <TAB> = %q, want the shell's file completion", got)
				}
			})
			// The actions must never run, whatever was typed: a reconcile
			// would write its metrics file, a sweep --apply would unlink
			// the orphan, watch would never return.
			t.Run("never runs the command", func(t *testing.T) {
				dir := t.TempDir()
				metrics := filepath.Join(dir, "m.prom")
				orphan := orphanSock(t, dir, goneSockName(t))
				for _, words := range [][]string{
					{"reconcile", "--metrics-file", metrics, "--"},
					{"reconcile", "--metrics-file", metrics, "--", ""},
					{"reconcile", "--apply", "--metrics-file", metrics, "--"},
					{"sweep", "--apply", "--socket-dir", dir, "--metrics-file", metrics, "--"},
					{"sweep", "--apply", "--socket-dir", dir, "--metrics-file", metrics, ""},
					{"watch", "--"},
					{"watch", "--once", "--metrics-file", metrics, ""},
				} {
					tab(t, shell, bin, words...)
					if _, err := os.Stat(metrics); err == nil {
						t.Fatalf("TAB after %q ran the command: it wrote %s", words, metrics)
					}
					if _, err := os.Lstat(orphan); err != nil {
						t.Fatalf("TAB after %q ran sweep --apply: %v", words, err)
					}
				}
			})
		})
	}
}

// TestCompletionLegacyFlag: urfave/cli's own protocol, which scripts from
// earlier releases still use, is answered without running anything, also
// after a "--".
func TestCompletionLegacyFlag(t *testing.T) {
	metrics := filepath.Join(t.TempDir(), "m.prom")
	for _, args := range [][]string{
		{"reconcile", "--metrics-file", metrics, "--", "--generate-bash-completion"},
		{"reconcile", "--metrics-file", metrics, "--generate-bash-completion"},
		{"--generate-bash-completion"},
	} {
		code, out := runJanitorCapture(t, args...)
		if code != exitOK {
			t.Errorf("%q: exit %d", args, code)
		}
		if _, err := os.Stat(metrics); err == nil {
			t.Fatalf("%q ran reconcile:\n%s", args, out)
		}
		if args[0] == cliapp.LegacyCompleteFlag && !strings.Contains(out, "reconcile\n") {
			t.Errorf("%q: %q", args, out)
		}
	}
}
