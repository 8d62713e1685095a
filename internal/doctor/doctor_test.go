package doctor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// program writes an executable named name, holding content, in a fresh
// temp dir closed to other users.
func program(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, content, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var exitZero = []byte("#!/bin/sh\nexit 0\n")

// fakeHook is an executable standing in for the installed kc-hook.
func fakeHook(t *testing.T) string { return program(t, "kc-hook", exitZero) }

func descriptor(path, stage string, env ...string) string {
	d := map[string]any{
		"version": "1.0.0",
		"hook":    map[string]any{"path": path, "args": []string{"kc-hook", stage}, "env": env, "timeout": 30},
		"when":    map[string]any{"always": true},
		"stages":  []string{stage},
	}
	b, _ := json.Marshal(d)
	return string(b)
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// installPair writes the two descriptors the repository ships.
func installPair(t *testing.T, dir, hook string, env ...string) {
	write(t, dir, "kc-hook-createruntime.json", descriptor(hook, "createRuntime", env...))
	write(t, dir, "kc-hook-poststop.json", descriptor(hook, "poststop", env...))
}

func TestShippedDescriptorsAreValid(t *testing.T) {
	files, _ := filepath.Glob("../../hooks.d/*.json")
	if len(files) == 0 {
		t.Fatal("no descriptors in hooks.d")
	}
	hook := fakeHook(t)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte("/usr/local/libexec/oci/hooks.d/kc-hook"), []byte(hook))
		if d := ParseDescriptor(f, data); !d.Valid() {
			t.Errorf("%s: %v", f, d.Problems)
		}
	}
}

func TestHookInstalled(t *testing.T) {
	state := "/run/kc-watchman"
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  Verdict
		text  string // in the detail or an item
	}{
		{"installed", func(t *testing.T, dir string) { installPair(t, dir, fakeHook(t)) }, OK, "kc-hook-poststop.json"},
		{"no descriptor", func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "other-hook")
			os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755)
			write(t, dir, "other.json", `{"version":"1.0.0","hook":{"path":"`+other+`"},"when":{"always":true},"stages":["poststop"]}`)
		}, Error, "no kc-hook descriptor"},
		{"no hooks dir at all", func(t *testing.T, dir string) {}, Error, "no kc-hook descriptor"},
		{"binary missing", func(t *testing.T, dir string) {
			installPair(t, dir, "/nonexistent/libexec/kc-hook")
		}, Error, "does not exist: podman silently drops"},
		{"binary not executable", func(t *testing.T, dir string) {
			h := fakeHook(t)
			os.Chmod(h, 0o644)
			installPair(t, dir, h)
		}, Error, "not executable"},
		{"malformed descriptor", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-poststop.json", `{"version": "1.0.0", "hook": {"path": "/x/kc-hook"`)
			write(t, dir, "kc-hook-createruntime.json", descriptor(fakeHook(t), "createRuntime"))
		}, Error, "malformed JSON"},
		{"malformed next to a working pair", func(t *testing.T, dir string) {
			installPair(t, dir, fakeHook(t))
			write(t, dir, "kc-hook-old.json", `{"version": "1.0.0", "hook": `)
		}, Warn, "malformed JSON"},
		{"wrong version", func(t *testing.T, dir string) {
			installPair(t, dir, fakeHook(t))
			p := filepath.Join(dir, "kc-hook-poststop.json")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(data, []byte(`"1.0.0"`), []byte(`"0.1.0"`), 1), 0o644)
		}, Error, `version "0.1.0"`},
		{"no version", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-poststop.json", `{"hook":{"path":"`+fakeHook(t)+`","args":["kc-hook","poststop"]},"when":{"always":true},"stages":["poststop"]}`)
		}, Error, `no "version"`},
		{"null descriptor", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-poststop.json", `null`)
		}, Error, "no hook.path"},
		{"two stages in one file", func(t *testing.T, dir string) {
			h := fakeHook(t)
			write(t, dir, "kc-hook.json", `{"version":"1.0.0","hook":{"path":"`+h+`","args":["kc-hook","poststop"]},"when":{"always":true},"stages":["createRuntime","poststop"]}`)
		}, Error, "same args"},
		{"stage argument differs", func(t *testing.T, dir string) {
			h := fakeHook(t)
			write(t, dir, "kc-hook-createruntime.json", descriptor(h, "createRuntime"))
			write(t, dir, "kc-hook-poststop.json", `{"version":"1.0.0","hook":{"path":"`+h+`","args":["kc-hook","createRuntime"]},"when":{"always":true},"stages":["poststop"]}`)
		}, Error, "runs kc-hook as createRuntime"},
		{"when matches nothing", func(t *testing.T, dir string) {
			h := fakeHook(t)
			write(t, dir, "kc-hook-createruntime.json", descriptor(h, "createRuntime"))
			write(t, dir, "kc-hook-poststop.json", `{"version":"1.0.0","hook":{"path":"`+h+`","args":["kc-hook","poststop"]},"when":{"always":false},"stages":["poststop"]}`)
		}, Error, "matches no container"},
		{"bad annotation pattern", func(t *testing.T, dir string) {
			h := fakeHook(t)
			write(t, dir, "kc-hook-createruntime.json", descriptor(h, "createRuntime"))
			write(t, dir, "kc-hook-poststop.json", `{"version":"1.0.0","hook":{"path":"`+h+`","args":["kc-hook","poststop"]},"when":{"annotations":{"(":"x"}},"stages":["poststop"]}`)
		}, Error, "bad pattern"},
		{"annotation-only is fine", func(t *testing.T, dir string) {
			h := fakeHook(t)
			write(t, dir, "kc-hook-createruntime.json", descriptor(h, "createRuntime"))
			write(t, dir, "kc-hook-poststop.json", `{"version":"1.0.0","hook":{"path":"`+h+`","args":["kc-hook","poststop"]},"when":{"annotations":{"^io\\.kc-watchman\\.enable$":"^true$"}},"stages":["poststop"]}`)
		}, OK, "only for containers matching annotation"},
		{"only createRuntime", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-createruntime.json", descriptor(fakeHook(t), "createRuntime"))
		}, Error, "poststop not covered"},
		{"only poststop", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-poststop.json", descriptor(fakeHook(t), "poststop"))
		}, Warn, "no init process"},
		{"other state dir", func(t *testing.T, dir string) {
			installPair(t, dir, fakeHook(t), "KC_STATE_DIR=/var/lib/elsewhere")
		}, Warn, "the janitor reads /run/kc-watchman"},
		// It still records: no "no init process" said of it.
		{"a deadline no launch fits in", func(t *testing.T, dir string) {
			installPair(t, dir, fakeHook(t), "KC_HOOK_DEADLINE=5s")
		}, Warn, "no supervisor is launched"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hooks.d")
			c.setup(t, dir)
			got, _ := HookInstalled(context.Background(), []string{dir}, state, state)
			all := got.Detail + "\n" + strings.Join(got.Items, "\n")
			if got.Verdict != c.want || !strings.Contains(all, c.text) {
				t.Errorf("verdict %v, want %v; want %q in:\n%s", got.Verdict, c.want, c.text, all)
			}
			if c.text != "no init process" && strings.Contains(all, "no init process") {
				t.Errorf("a recording descriptor not counted:\n%s", all)
			}
		})
	}
}

// TestHookInstalledSettings runs the real kc-hook with each descriptor's
// args and env: settings it refuses are an error at poststop (every stop
// would fail) and a warning at createRuntime (it records nothing, runc
// drops its warning); doctor's own environment does not leak into the
// check, and a program that does not answer the check is taken as it is.
func TestHookInstalledSettings(t *testing.T) {
	hook := testutil.Build(t, testutil.KCHookPackage, "kc-hook")
	state := "/run/kc-watchman"
	t.Setenv("KC_KILL_GRACE", "doctor's own, unusable")
	for _, c := range []struct {
		name     string
		post, cr []string // the descriptors' env
		hook     string
		want     Verdict
		text     string
	}{
		{"accepted", []string{"KC_KILL_GRACE=2s"}, nil, hook, OK, "kc-hook-poststop.json"},
		{"refused at poststop", []string{"KC_KILL_GRACE=soon"}, nil, hook, Error, `kc-hook-poststop.json: kc-hook refuses its settings: invalid value "soon" for $KC_KILL_GRACE`},
		{"refused at createRuntime", nil, []string{"KC_BPF=yes"}, hook, Warn, "kc-hook-createruntime.json: kc-hook refuses its settings: --bpf"},
		{"relative state dir", []string{"KC_STATE_DIR=kc"}, nil, hook, Error, "absolute path"},
		{"not answering the check", []string{"KC_KILL_GRACE=soon"}, nil, fakeHook(t), OK, "kc-hook-poststop.json"},
		{"writable by others: not run, and an error", []string{"KC_KILL_GRACE=soon"}, nil, openCopy(t, hook), Error, "kc-hook-poststop.json: settings not checked: /"},
		{"writable by others: says why", nil, nil, openCopy(t, hook), Error, "kc-hook is writable by group or others (mode 0777); the runtime runs"},
		{"a wrapper: said, not run, no verdict", []string{"KC_KILL_GRACE=soon"}, nil, wrapper(t), OK, "kc-hook-poststop.json: settings not checked: not kc-hook: "},
		{"not a program", nil, nil, garbage(t), Error, "kc-hook-poststop.json: cannot run"},
		{"not a program: the runtime fails too", nil, nil, garbage(t), Error, "the runtime will fail to run it too"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hooks.d")
			write(t, dir, "kc-hook-createruntime.json", descriptor(c.hook, "createRuntime", c.cr...))
			write(t, dir, "kc-hook-poststop.json", descriptor(c.hook, "poststop", c.post...))
			got, _ := HookInstalled(context.Background(), []string{dir}, state, state)
			all := got.Detail + "\n" + strings.Join(got.Items, "\n")
			if got.Verdict != c.want || !strings.Contains(all, c.text) {
				t.Errorf("verdict %v, want %v; want %q in:\n%s", got.Verdict, c.want, c.text, all)
			}
			if refused := strings.Contains(all, "refuses its settings"); refused != strings.Contains(got.Remedy, "descriptor's args or env") {
				t.Errorf("remedy %q for a check that refused settings: %v", got.Remedy, refused)
			}
		})
	}
}

// openCopy is a copy of bin named kc-hook that any user could rewrite.
func openCopy(t *testing.T, bin string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kc-hook")
	if err := testutil.CopyFile(bin, p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o777); err != nil {
		t.Fatal(err)
	}
	return p
}

// wrapper is a program not named kc-hook that says nothing and exits 0.
func wrapper(t *testing.T) string { return program(t, "kc-hook-wrapper", exitZero) }

// garbage is an executable named kc-hook that the kernel cannot run.
func garbage(t *testing.T) string {
	return program(t, "kc-hook", []byte{0x7f, 'E', 'L', 'F', 0, 0, 0, 0})
}

// TestHookSettingsRunsOnlyKCHook: doctor runs, as root, only a program
// named kc-hook that no other user could have written or swapped, named
// by a descriptor no other user could have written; every refusal says
// why, and one that leaves a hole open is an error.
func TestHookSettingsRunsOnlyKCHook(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	script := []byte("#!/bin/sh\ntouch " + marker + "\n")
	// Each case lays out a tree under base: "kc-hook" is the program the
	// descriptor names unless path says otherwise; desc is the
	// descriptor's file.
	type layout struct {
		path   string // the descriptor's hook.path, under base
		real   string // where the script is, under base
		dirs   map[string]os.FileMode
		links  map[string]string
		mode   os.FileMode // the script's
		owner  map[string]int
		desc   string
		dmode  os.FileMode
		sticky string
	}
	for _, tc := range []struct {
		name string
		l    layout
		ran  bool
		err  error // what hookSettings' error wraps
	}{
		{name: "kc-hook of this user's", l: layout{}, ran: true},
		{name: "a wrapper given kc-hook's argv[0]", l: layout{path: "wrapper", real: "wrapper"}, err: errNotKCHook},
		{name: "a wrapper others may write", l: layout{path: "wrapper", real: "wrapper", mode: 0o777}, err: trust.ErrUntrusted},
		{name: "kc-hook leading to another name", l: layout{path: "kc-hook", real: "wrapper", links: map[string]string{"kc-hook": "wrapper"}}, err: errNotKCHook},
		{name: "kc-hook writable by others", l: layout{mode: 0o777}, err: trust.ErrUntrusted},
		{name: "kc-hook writable by its group", l: layout{mode: 0o775}, err: trust.ErrUntrusted},
		{name: "kc-hook of another user's", l: layout{owner: map[string]int{"kc-hook": 65534}}, err: trust.ErrUntrusted},
		{name: "kc-hook in a directory of another user's", l: layout{path: "bin/kc-hook", real: "bin/kc-hook", dirs: map[string]os.FileMode{"bin": 0o755}, owner: map[string]int{"bin": 65534}}, err: trust.ErrUntrusted},
		{name: "kc-hook in a directory others may write", l: layout{path: "open/kc-hook", real: "open/kc-hook", dirs: map[string]os.FileMode{"open": 0o777}}, err: trust.ErrUntrusted},
		{name: "kc-hook in a sticky directory its group may write", l: layout{path: "shared/kc-hook", real: "shared/kc-hook", dirs: map[string]os.FileMode{"shared": 0o775}, sticky: "shared"}, ran: true},
		{name: "kc-hook through a symlinked directory", l: layout{path: "local/kc-hook", real: "var/local/kc-hook", dirs: map[string]os.FileMode{"var": 0o755, "var/local": 0o755}, links: map[string]string{"local": "var/local"}}, ran: true},
		{name: "kc-hook through a symlink in a directory others may write", l: layout{path: "open/kc-hook", real: "real/kc-hook", dirs: map[string]os.FileMode{"open": 0o777, "real": 0o755}, links: map[string]string{"open/kc-hook": "../real/kc-hook"}}, err: trust.ErrUntrusted},
		{name: "a descriptor others may write", l: layout{dmode: 0o666}, err: trust.ErrUntrusted},
		{name: "a descriptor of another user's", l: layout{owner: map[string]int{"hooks.d/kc-hook.json": 65534}}, err: trust.ErrUntrusted},
		{name: "a descriptor in a directory others may write", l: layout{desc: "open/kc-hook.json", dirs: map[string]os.FileMode{"open": 0o777}}, err: trust.ErrUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.l.owner) > 0 && os.Geteuid() != 0 {
				t.Skip("needs root: it gives a file to another user")
			}
			os.Remove(marker)
			base := t.TempDir()
			if err := os.Chmod(base, 0o755); err != nil {
				t.Fatal(err)
			}
			l := tc.l
			l.path, l.real, l.desc = cmp.Or(l.path, "kc-hook"), cmp.Or(l.real, "kc-hook"), cmp.Or(l.desc, "hooks.d/kc-hook.json")
			for _, d := range slices.Sorted(maps.Keys(l.dirs)) {
				if err := os.Mkdir(filepath.Join(base, d), l.dirs[d]); err != nil {
					t.Fatal(err)
				}
				mode := l.dirs[d]
				if d == l.sticky {
					mode |= os.ModeSticky
				}
				if err := os.Chmod(filepath.Join(base, d), mode); err != nil {
					t.Fatal(err)
				}
			}
			desc := write(t, filepath.Join(base, filepath.Dir(l.desc)), filepath.Base(l.desc), "{}")
			if err := os.Chmod(desc, cmp.Or(l.dmode, 0o644)); err != nil {
				t.Fatal(err)
			}
			real := filepath.Join(base, l.real)
			if err := os.WriteFile(real, script, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(real, cmp.Or(l.mode, 0o755)); err != nil {
				t.Fatal(err)
			}
			for link, to := range l.links {
				if err := os.Symlink(to, filepath.Join(base, link)); err != nil {
					t.Fatal(err)
				}
			}
			for p, uid := range l.owner {
				if err := os.Lchown(filepath.Join(base, p), uid, uid); err != nil {
					t.Fatal(err)
				}
			}
			d := Descriptor{File: desc, Path: filepath.Join(base, l.path), Args: []string{"kc-hook", "poststop"}}
			why, err := hookSettings(context.Background(), d)
			if why != "" || !errors.Is(err, tc.err) || (err != nil) != (tc.err != nil) {
				t.Errorf("hookSettings = %q, %v; want nothing refused and %v", why, err, tc.err)
			}
			if tc.err != nil && !errors.Is(err, errNotChecked) {
				t.Errorf("hookSettings: %v, want it to say the settings were not checked", err)
			}
			if _, err := os.Stat(marker); (err == nil) != tc.ran {
				t.Errorf("%s: ran %v, want %v", d.Path, err == nil, tc.ran)
			}
		})
	}
}

// A kc-hook that overstays, or exits leaving a child behind in its group:
// either way the check returns in time and the child is gone.
func TestHookSettingsOverstays(t *testing.T) {
	for _, tc := range []struct {
		name, tail string
		answer     bool // the check reports that it did not answer
	}{
		{name: "waits for its child", tail: "wait\n", answer: true},
		{name: "exits at once", tail: "exit 0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			hook := filepath.Join(dir, "kc-hook")
			pidFile := filepath.Join(dir, "child")
			script := "#!/bin/sh\nsleep 600 &\necho $! >" + pidFile + "\n" + tc.tail
			if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			desc := write(t, dir, "kc-hook.json", "{}")
			why, err := hookSettings(ctx, Descriptor{File: desc, Path: hook, Args: []string{"kc-hook", "poststop"}})
			if tc.answer && (why != "" || err == nil || !strings.Contains(err.Error(), "did not answer")) {
				t.Fatalf("hookSettings = %q, %v; want it to say the hook did not answer", why, err)
			}
			if !tc.answer && (why != "" || err != nil) {
				t.Fatalf("hookSettings = %q, %v; want no verdict", why, err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("hookSettings took %s past a 500ms deadline", took)
			}
			pid := testutil.ReadPID(t, pidFile)
			if !testutil.WaitStopped(pid, 5*time.Second) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("the hook's child %d outlived the check", pid)
			}
		})
	}
}

// A descriptor in a directory of higher precedence masks one of the same
// name, as podman does; a broken override breaks a good default.
func TestHookInstalledMasking(t *testing.T) {
	base := t.TempDir()
	low, high := filepath.Join(base, "usr"), filepath.Join(base, "etc")
	installPair(t, low, fakeHook(t))
	write(t, high, "kc-hook-poststop.json", descriptor("/gone/kc-hook", "poststop"))
	got, descs := HookInstalled(context.Background(), []string{low, high}, "/run/kc-watchman", "/run/kc-watchman")
	if got.Verdict != Error || !strings.Contains(strings.Join(got.Items, "\n"), "masked by "+filepath.Join(high, "kc-hook-poststop.json")) {
		t.Errorf("%+v", got)
	}
	if len(descs) != 3 {
		t.Errorf("%d descriptors, want 3", len(descs))
	}
}

func TestHooksDirs(t *testing.T) {
	if got := HooksDirs([]string{"/a"}, []string{"/b"}); strings.Join(got, ",") != "/a" {
		t.Errorf("explicit: %v", got)
	}
	got := HooksDirs(nil, []string{DefaultHooksDir, "/srv/hooks"})
	want := []string{DefaultHooksDir, OverrideHooksDir, "/srv/hooks"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestHookStateDir(t *testing.T) {
	dir := t.TempDir()
	installPair(t, dir, fakeHook(t), "KC_STATE_DIR=/srv/kc", "KC_HOOK_LOG=/var/log/kc-hook.log")
	descs, _ := FindDescriptors([]string{dir})
	sd, lf := HookStateDir(descs, "/run/kc-watchman")
	if sd != "/srv/kc" || lf != "/var/log/kc-hook.log" {
		t.Errorf("got %s %s", sd, lf)
	}
	sd, lf = HookStateDir(nil, "/run/kc-watchman")
	if sd != "/run/kc-watchman" || lf != "/run/kc-watchman/kc-hook.log" {
		t.Errorf("default: %s %s", sd, lf)
	}
}

func TestHookAlive(t *testing.T) {
	boot := time.Now().Add(-time.Hour)
	now := time.Now()
	logLine := func(at time.Time, stage string) string {
		b, _ := json.Marshal(map[string]any{"time": at, "level": "INFO", "msg": "recorded", "stage": stage, "container": strings.Repeat("a", 64)})
		return string(b) + "\n"
	}
	t.Run("log lines since boot", func(t *testing.T) {
		dir := t.TempDir()
		log := write(t, dir, "kc-hook.log", logLine(boot.Add(-time.Minute), "poststop")+"garbage\n"+
			logLine(now.Add(-2*time.Minute), "createRuntime")+logLine(now.Add(-time.Minute), "poststop"))
		c := HookAlive(AliveInput{StateDir: dir, LogFile: log, Boot: boot, LiveContainers: 3, Now: now})
		if c.Verdict != OK || !strings.Contains(c.Detail, "2 log lines") || !strings.Contains(c.Detail, "last: poststop 1m0s ago") {
			t.Errorf("%+v", c)
		}
	})
	t.Run("ledger stages since boot", func(t *testing.T) {
		dir := t.TempDir()
		st, err := ledger.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Update(strings.Repeat("b", 64), func(r *ledger.Record) error {
			r.Stages = map[string]time.Time{"createRuntime": now.Add(-5 * time.Minute)}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		c := HookAlive(AliveInput{StateDir: dir, LogFile: filepath.Join(dir, "none.log"), Boot: boot, LiveContainers: 1, Now: now})
		if c.Verdict != OK || !strings.Contains(c.Detail, "1 container recorded") {
			t.Errorf("%+v", c)
		}
	})
	for _, c := range []struct {
		live int
		want Verdict
		text string
	}{
		{2, Warn, "the hook does not fire"},
		{0, OK, "cannot tell yet"},
		{-1, Warn, "podman could not be asked"},
	} {
		dir := t.TempDir()
		log := write(t, dir, "kc-hook.log", logLine(boot.Add(-time.Minute), "poststop"))
		got := HookAlive(AliveInput{StateDir: filepath.Join(dir, "missing"), LogFile: log, Boot: boot, LiveContainers: c.live, Now: now})
		if got.Verdict != c.want || !strings.Contains(got.Text(), c.text) {
			t.Errorf("live %d: %+v", c.live, got)
		}
	}
}

func TestBootTime(t *testing.T) {
	bt, err := BootTime("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if bt.After(time.Now()) || time.Since(bt) > 10*365*24*time.Hour {
		t.Errorf("boot time %v", bt)
	}
}

func TestStateDir(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		c := StateDir(filepath.Join(t.TempDir(), "nope"))
		if c.Verdict != Warn || !strings.Contains(c.Detail, "does not exist") {
			t.Errorf("%+v", c)
		}
	})
	t.Run("not a directory", func(t *testing.T) {
		c := StateDir(write(t, t.TempDir(), "f", "x"))
		if c.Verdict != Error {
			t.Errorf("%+v", c)
		}
	})
	t.Run("good, with records", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		st, err := ledger.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		st.Update(strings.Repeat("c", 64), func(*ledger.Record) error { return nil })
		c := StateDir(dir)
		if c.Verdict != OK || !strings.Contains(c.Detail, "1 ledger record (1 from this boot)") {
			t.Errorf("%+v", c)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "containers"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".doctor") {
				t.Errorf("probe file left: %s", e.Name())
			}
		}
	})
	for _, tc := range []struct {
		name    string
		mode    os.FileMode
		verdict Verdict
		wants   []string
	}{
		{"unreadable record", 0o700, Warn, []string{"unreadable record"}},
		// The records are not read: a planted one could name anyone.
		{"loose ledger dir", 0o777, Error, []string{"mode 0777", "not used"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if _, err := ledger.Open(dir); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "containers"), strings.Repeat("d", 64)+".json", "{torn")
			os.Chmod(filepath.Join(dir, "containers"), tc.mode)
			c := StateDir(dir)
			all := c.Detail + strings.Join(c.Items, "\n")
			for _, w := range tc.wants {
				if c.Verdict != tc.verdict || !strings.Contains(all, w) {
					t.Errorf("want %v saying %q: %+v", tc.verdict, w, c)
				}
			}
		})
	}
	// What LockApply refuses is an error: no --apply run would act.
	for _, tc := range []struct {
		name, why string
		prepare   func(t *testing.T, dir string) string
	}{
		{"writable by others", "writable by group or others (mode 0777)", func(t *testing.T, dir string) string {
			os.Chmod(dir, 0o777)
			return dir
		}},
		{"a symlink", "is a symlink", func(t *testing.T, dir string) string {
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			return link
		}},
		{"another user's", "is owned by UID 65534", func(t *testing.T, dir string) string {
			if os.Geteuid() != 0 {
				t.Skip("needs root: it gives the dir away")
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if _, err := ledger.Open(dir); err != nil {
				t.Fatal(err)
			}
			state := tc.prepare(t, dir)
			c := StateDir(state)
			if c.Verdict != Error || !strings.Contains(c.Detail, tc.why) || !strings.Contains(c.Detail, "--apply runs refuse it") || c.Remedy == "" {
				t.Errorf("%+v; want an ERROR saying %q, with a remedy", c, tc.why)
			}
			unlock, err := ledger.LockApply(context.Background(), state, time.Millisecond)
			if err == nil {
				unlock()
				t.Errorf("LockApply took a state dir doctor calls refused")
			}
		})
	}
	if os.Geteuid() == 0 {
		return // root writes anywhere: not-writable needs another user
	}
	t.Run("not writable", func(t *testing.T) {
		dir := t.TempDir()
		os.Chmod(dir, 0o500)
		defer os.Chmod(dir, 0o700)
		if c := StateDir(dir); c.Verdict != Error {
			t.Errorf("%+v", c)
		}
	})
}

// TestEngineVerdicts: each engine's check and the engines line, from
// what was found and asked; a named engine that cannot be asked is an
// error with a remedy, one auto found is a warning.
func TestEngineVerdicts(t *testing.T) {
	down := errors.New("dial unix /x/docker.sock: connect: no such file or directory")
	answered := EngineInput{Name: NameDocker, Endpoint: "unix:///x/docker.sock", Found: true, Asked: true, Source: "api",
		UID: 0, Containers: 3, Live: 2, Version: "20.10.24 (API 1.41)", Took: 4 * time.Millisecond}
	for _, tc := range []struct {
		name    string
		auto    bool
		e       EngineInput
		verdict Verdict
		want    []string
	}{
		{"answered", true, answered, OK, []string{"api unix:///x/docker.sock: version 20.10.24 (API 1.41), 3 containers, 2 live, uid 0 (4ms)"}},
		{"auto found, unreachable", true, EngineInput{Name: NameDocker, Endpoint: "unix:///x/docker.sock", Found: true, Asked: true, Err: down},
			Warn, []string{"unreachable", "exit 3", "auto found its endpoint", "no such file", "remedy: start dockerd"}},
		{"named, unreachable", false, EngineInput{Name: NameContainerd, Endpoint: "/x/containerd.sock", Named: true, Asked: true, Err: down},
			Error, []string{"unreachable", "--engine names it", "remedy: start containerd or point --containerd-address"}},
		{"named podman, unreachable", false, EngineInput{Name: NamePodman, Endpoint: "unix:///x/podman.sock", Named: true, Asked: true, Err: down},
			Error, []string{"remedy: start podman's API service"}},
		{"cli", true, EngineInput{Name: NamePodman, Endpoint: "podman ps", Found: true, Asked: true, Source: "cli", UID: 0, Containers: 1, Live: 1},
			OK, []string{"version ?", "the API did not answer"}},
		{"tcp", false, EngineInput{Name: NameDocker, Endpoint: "tcp://h:2375", Named: true, Asked: true, Source: "api", UID: engine.UIDUnknown},
			Warn, []string{"owner is unknown"}},
		{"auto, absent", true, EngineInput{Name: NameContainerd, Endpoint: "/run/containerd/containerd.sock"}, OK,
			[]string{"not asked: auto found nothing at /run/containerd/containerd.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, checks, reps := Engines(EnginesInput{Auto: tc.auto, Engines: []EngineInput{tc.e}})
			if len(checks) != 1 {
				t.Fatalf("checks %+v, want one", checks)
			}
			c := checks[0]
			if c.Name != tc.e.Name || c.Verdict != tc.verdict {
				t.Errorf("check %+v, want %s %v", c, tc.e.Name, tc.verdict)
			}
			for _, w := range tc.want {
				if !strings.Contains(c.Text(), w) {
					t.Errorf("detail %q lacks %q", c.Text(), w)
				}
			}
			r := reps[0]
			if r.Reachable != (tc.e.Asked && tc.e.Err == nil) || (r.Error != nil) != (tc.e.Err != nil) {
				t.Errorf("report %+v", r)
			}
		})
	}
}

func TestEnginesSummary(t *testing.T) {
	pm := EngineInput{Name: NamePodman, Endpoint: "unix:///run/podman/podman.sock", Found: true, Asked: true}
	dk := EngineInput{Name: NameDocker, Endpoint: "unix:///var/run/docker.sock"}
	cd := EngineInput{Name: NameContainerd, Endpoint: "/run/containerd/containerd.sock"}
	for _, tc := range []struct {
		name    string
		in      EnginesInput
		verdict Verdict
		detail  string
	}{
		{"auto found one", EnginesInput{Auto: true, Engines: []EngineInput{pm, dk, cd}}, OK,
			"auto found podman (unix:///run/podman/podman.sock); not found: docker at unix:///var/run/docker.sock, containerd at /run/containerd/containerd.sock"},
		{"auto found none", EnginesInput{Auto: true, Engines: []EngineInput{dk, cd}}, Warn,
			"auto found no engine (looked for docker at unix:///var/run/docker.sock, containerd at /run/containerd/containerd.sock), so reconcile would touch nothing (exit 3); remedy: start one, or name it with --engine and its endpoint"},
		{"auto found one, for a user", EnginesInput{Auto: true, NotRoot: true, Engines: []EngineInput{pm, dk}}, OK,
			"auto found podman (unix:///run/podman/podman.sock); not found or not connectable: docker at unix:///var/run/docker.sock"},
		{"auto found none, for a user", EnginesInput{Auto: true, NotRoot: true, Engines: []EngineInput{dk}}, Warn,
			"auto found no engine this user can connect to (looked for docker at unix:///var/run/docker.sock), so reconcile would touch nothing (exit 3); remedy: start one, or name it with --engine and its endpoint"},
		{"named", EnginesInput{Engines: []EngineInput{pm, {Name: NameDocker, Endpoint: "unix:///d.sock", Named: true, Asked: true}, cd}}, OK,
			"named by --engine: podman (unix:///run/podman/podman.sock), docker (unix:///d.sock)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := Engines(tc.in)
			if c.Name != NameEngines || c.Verdict != tc.verdict || c.Text() != tc.detail {
				t.Errorf("got %v %q\nwant %v %q", c.Verdict, c.Text(), tc.verdict, tc.detail)
			}
		})
	}
}

// with is r changed by f.
func with(r reconcile.Report, f func(*reconcile.Report)) reconcile.Report {
	f(&r)
	return r
}

func TestStraysVerdict(t *testing.T) {
	tree := func(a action.Action) reconcile.Tree {
		return reconcile.Tree{ContainerID: strings.Repeat("e", 64), PGID: 42, AgeSeconds: 100, Action: a,
			Members: []reconcile.Member{{PID: 42, Comm: "kcserver"}}}
	}
	rep := func(actions ...action.Action) reconcile.Report {
		r := reconcile.Report{LivenessKnown: true}
		for _, a := range actions {
			r.Trees = append(r.Trees, tree(a))
		}
		return r
	}
	for _, c := range []struct {
		name string
		in   StraysInput
		want Verdict
		text string
	}{
		{"unknown", StraysInput{LivenessErr: errors.New("x")}, Warn, "not checked"},
		{"none", StraysInput{Report: rep(action.SkipLive, action.SkipYoung)}, OK, "none; 2 trees"},
		{"dry", StraysInput{Report: rep(action.WouldReap, action.SkipLive)}, Warn, "1 stray tree; remedy: run kc-janitor doctor --fix"},
		{"fixed", StraysInput{Report: rep(action.Reaped, action.Gone), Fix: true}, OK, "fixed: reaped 2"},
		{"would not die", StraysInput{Report: rep(action.Reaped, action.WouldNotDie), Fix: true}, Error, "1 would not die"},
		{"refused by the blast-radius guard", StraysInput{Report: with(rep(action.WouldReap, action.WouldReap), func(r *reconcile.Report) { r.Refused = "too many" }), Fix: true}, Error, "nothing reaped: too many"},
		{"reaped unrecorded", StraysInput{Report: with(rep(action.Reaped), func(r *reconcile.Report) { r.Unrecorded = errors.New("disk full") }), Fix: true}, Error, "not recorded in the ledger: disk full"},
		{"a cgroup that would not die", StraysInput{Report: with(rep(), func(r *reconcile.Report) {
			r.Cgroups = []reconcile.Cgroup{{ContainerID: strings.Repeat("e", 64), Cgroup: ledger.Cgroup{Path: "kc-watchman/e", Outcome: action.WouldNotDie}}}
		}), Fix: true}, Error, "1 would not die"},
		{"a cgroup to sweep, dry", StraysInput{Report: with(rep(), func(r *reconcile.Report) {
			r.Cgroups = []reconcile.Cgroup{{ContainerID: strings.Repeat("e", 64), Cgroup: ledger.Cgroup{Path: "kc-watchman/e", Outcome: action.WouldReap}}}
		})}, Warn, "1 stray tree"},
		{"dry, and --fix would be refused", StraysInput{Report: with(rep(action.WouldReap), func(r *reconcile.Report) { r.WouldRefuse = "too many" })}, Warn, "--fix would reap none of them: too many"},
	} {
		got := Strays(c.in)
		if got.Verdict != c.want || !strings.Contains(got.Text(), c.text) {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
	got := Strays(StraysInput{Report: rep(action.WouldReap)})
	if len(got.Items) != 1 || !strings.Contains(got.Items[0], "eeeeeeeeeeee pgid 42") || !strings.Contains(got.Items[0], "kcserver(42)") {
		t.Errorf("items %q", got.Items)
	}
	// A stray tree's cgroup goes with it: one item, not two.
	got = Strays(StraysInput{Report: with(rep(action.WouldReap), func(r *reconcile.Report) {
		r.Cgroups = []reconcile.Cgroup{{ContainerID: strings.Repeat("e", 64), Cgroup: ledger.Cgroup{Path: "kc-watchman/e", Outcome: action.WouldReap}}}
	})})
	if len(got.Items) != 1 {
		t.Errorf("a stray tree and its cgroup: items %q, want the tree alone", got.Items)
	}
	// A user's group of thousands, one of them named to read as two.
	big := tree(action.WouldReap)
	big.Members = []reconcile.Member{{PID: 42, Comm: "a b"}}
	for i := range 2000 {
		big.Members = append(big.Members, reconcile.Member{PID: 100 + i, Comm: "sleep"})
	}
	got = Strays(StraysInput{Report: reconcile.Report{LivenessKnown: true, Trees: []reconcile.Tree{big}}})
	if it := got.Items[0]; len(it) > 300 || !strings.Contains(it, `"a b"(42)`) || !strings.Contains(it, "(+1993 more)") {
		t.Errorf("item of a tree of 2001: %d bytes: %q", len(it), it)
	}
}

func TestSocketsVerdict(t *testing.T) {
	rep := &sweep.Report{Sockets: []*sweep.Socket{
		{Path: "/tmp/kc-1.sock", PID: 1, Kind: sockets.KindControl, Verdict: sweep.VerdictLive},
		{Path: "/tmp/kc-2.sock", PID: 2, Kind: sockets.KindControl, Verdict: sweep.VerdictStale, Reason: "gone"},
	}}
	c := Sockets(rep, nil)
	if c.Verdict != Warn || !strings.Contains(c.Detail, "1 stale") || len(c.Items) != 1 {
		t.Errorf("%+v", c)
	}
	rep.Sockets = rep.Sockets[:1]
	if c := Sockets(rep, nil); c.Verdict != OK {
		t.Errorf("%+v", c)
	}
	if c := Sockets(nil, errors.New("boom")); c.Verdict != Warn {
		t.Errorf("%+v", c)
	}
}

func TestSessionsVerdict(t *testing.T) {
	idle := kallichore.ActiveSession{SessionID: "s1", Language: "python", Status: "idle", IdleSeconds: 90000}
	sups := []cull.Supervisor{{Source: cull.Source{Socket: "/tmp/kc-1.sock", PID: 1}, SessionsTotal: 2, Candidates: []kallichore.ActiveSession{idle}}}
	c := Sessions(sups, 86400, nil)
	if c.Verdict != Warn || !strings.Contains(c.Detail, "1 session idle") || len(c.Items) != 1 {
		t.Errorf("%+v", c)
	}
	sups[0].Candidates = nil
	if c := Sessions(sups, 86400, nil); c.Verdict != OK || !strings.Contains(c.Detail, "0 sessions") {
		t.Errorf("%+v", c)
	}
	// The rule as it is, never rounded to two units.
	if c := Sessions(sups, 131401, nil); !strings.Contains(c.Detail, "more than 1d12h30m1s") {
		t.Errorf("threshold written as %q", c.Detail)
	}
	sups[0].Err = errors.New("refused")
	if c := Sessions(sups, 86400, nil); c.Verdict != Warn {
		t.Errorf("%+v", c)
	}
}

func TestReportOutput(t *testing.T) {
	var r Report
	r.Add(newCheck(NameHookInstalled, OK, "fine"))
	r.Add(newCheck(NameStrays, Warn, "2 stray trees"))
	r.Checks[1].Items = []string{"tree one"}
	if r.Worst != Warn {
		t.Errorf("worst %v", r.Worst)
	}
	var b bytes.Buffer
	r.WriteText(&b)
	want := "hook installed ................ ok (fine)\n" +
		"orphaned supervisor trees ..... WARN (2 stray trees; remedy: " + remedies[NameStrays] + ")\n" +
		"    tree one\n"
	if b.String() != want {
		t.Errorf("text:\n%s\nwant:\n%s", b.String(), want)
	}
	// What a user named (a comm, a path) reaches an item or a detail: a
	// newline or an escape sequence in it is shown escaped.
	b.Reset()
	var u Report
	u.Add(newCheck(NameStrays, Warn, "x\x1bc"))
	u.Checks[0].Items = []string{"pgid 7: k\nFORGED(7)"}
	u.WriteText(&b)
	if out := b.String(); strings.ContainsAny(out, "\x1b") || strings.Contains(out, "\nFORGED") || !strings.Contains(out, `"pgid 7: k\nFORGED(7)"`) {
		t.Errorf("text:\n%q", out)
	}
	b.Reset()
	r.Add(newCheck(NameStateDir, Error, "bad"))
	r.WriteJSON(&b)
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Worst != Error || len(back.Checks) != 3 || back.Checks[2].Name != NameStateDir {
		t.Errorf("%+v", back)
	}
	if !strings.Contains(b.String(), `"verdict": "warn"`) {
		t.Errorf("json: %s", b.String())
	}
}

// TestEveryCheckNamesARemedy: a check that is not ok says what to do
// (COMMANDS "doctor"): its own remedy, else its kind's; an ok one says none.
func TestEveryCheckNamesARemedy(t *testing.T) {
	for _, name := range Names {
		if remedies[name] == "" {
			t.Errorf("check %s has no remedy", name)
		}
		if labels[name] == "" || len(labels[name])+4 > labelWidth {
			t.Errorf("check %s: label %q does not fit %d columns with its dots", name, labels[name], labelWidth)
		}
	}
	var r Report
	own := newCheck(NameStateDir, Error, "bad")
	own.Remedy = "its own"
	for _, c := range []Check{newCheck(NameSessions, Warn, "could not audit"), own, newCheck(NameSockets, OK, "fine")} {
		r.Add(c)
	}
	if got := []string{r.Checks[0].Remedy, r.Checks[1].Remedy, r.Checks[2].Remedy}; got[0] != remedies[NameSessions] || got[1] != "its own" || got[2] != "" {
		t.Errorf("remedies %q", got)
	}
}

// TestHookAliveRootless: a rootless user's doctor counts only its own
// hook's log lines (a log file shared with root's hook is not evidence),
// and a hook that left a trace because it could not write its state dir is
// an error until it records a run again.
func TestHookAliveRootless(t *testing.T) {
	boot := time.Now().Add(-time.Hour)
	now := time.Now()
	line := func(at time.Time, uid int) string {
		b, _ := json.Marshal(map[string]any{"time": at, "msg": "recorded", "stage": "poststop", "host_uid": uid})
		return string(b) + "\n"
	}
	t.Run("another user's lines are not evidence", func(t *testing.T) {
		dir := t.TempDir()
		log := write(t, dir, "kc-hook.log", line(now.Add(-time.Minute), 0))
		c := HookAlive(AliveInput{StateDir: dir, LogFile: log, Boot: boot, LiveContainers: 1, Now: now, HostUID: 1001})
		if c.Verdict != Warn || !strings.Contains(c.Detail, "the hook does not fire") {
			t.Errorf("%+v", c)
		}
		c = HookAlive(AliveInput{StateDir: dir, LogFile: log, Boot: boot, LiveContainers: 1, Now: now, HostUID: 0})
		if c.Verdict != OK {
			t.Errorf("root's own lines: %+v", c)
		}
	})
	t.Run("a trace is an error until a later run", func(t *testing.T) {
		dir := t.TempDir()
		trace := filepath.Join(dir, "kc-hook.trace")
		e := ledger.TraceEntry{Time: now.Add(-time.Minute), Stage: "poststop", HostUID: 1001, StateDir: dir, Error: "mkdir " + dir + ": permission denied"}
		other := e
		other.StateDir, other.Error = "/elsewhere", "not this state dir's"
		for _, x := range []ledger.TraceEntry{e, other} {
			if _, err := ledger.WriteTrace([]string{trace}, x); err != nil {
				t.Fatal(err)
			}
		}
		in := AliveInput{StateDir: dir, LogFile: filepath.Join(dir, "none.log"), Boot: boot, LiveContainers: 1, Now: now, HostUID: 1001, TraceFiles: []string{trace}}
		c := HookAlive(in)
		if c.Verdict != Error || !strings.Contains(c.Detail, "permission denied") || !strings.Contains(c.Detail, trace) {
			t.Errorf("%+v", c)
		}
		in.LogFile = write(t, dir, "kc-hook.log", line(now.Add(-time.Second), 1001))
		if c := HookAlive(in); c.Verdict != OK {
			t.Errorf("after a later recorded run: %+v", c)
		}
	})
	t.Run("the latest trace by time, whatever file holds it", func(t *testing.T) {
		// /run's trace (read first) has the newest failure, /tmp's an
		// older one; a run was recorded between them.
		dir := t.TempDir()
		first, second := filepath.Join(dir, "run.trace"), filepath.Join(dir, "tmp.trace")
		newer := ledger.TraceEntry{Time: now.Add(-time.Minute), Stage: "poststop", HostUID: 1001, StateDir: dir, Error: "the newer failure"}
		older := newer
		older.Time, older.Error = now.Add(-2*time.Hour+time.Minute), "the older failure"
		if _, err := ledger.WriteTrace([]string{first}, newer); err != nil {
			t.Fatal(err)
		}
		if _, err := ledger.WriteTrace([]string{second}, older); err != nil {
			t.Fatal(err)
		}
		in := AliveInput{StateDir: dir, LogFile: write(t, dir, "kc-hook.log", line(now.Add(-30*time.Minute), 1001)), Boot: now.Add(-3 * time.Hour),
			LiveContainers: 1, Now: now, HostUID: 1001, TraceFiles: []string{first, second}}
		if c := HookAlive(in); c.Verdict != Error || !strings.Contains(c.Detail, "the newer failure") {
			t.Errorf("%+v; want the newer failure, after the last recorded run, an error", c)
		}
	})
}

// TestStateDirMissing: doctor says kc-hook creates a missing state dir
// only when it can.
func TestStateDirMissing(t *testing.T) {
	base := t.TempDir()
	if c := StateDir(filepath.Join(base, "state")); c.Verdict != Warn || !strings.Contains(c.Detail, "creates it on its first run") {
		t.Errorf("creatable: %+v", c)
	}
	c := StateDir(filepath.Join(base, "user", "1001", "kc-watchman"))
	if c.Verdict != Error || !strings.Contains(c.Detail, "cannot create it") {
		t.Errorf("parent missing: %+v", c)
	}
	if c := StateDir(filepath.Join(write(t, base, "f", "x"), "kc-watchman")); c.Verdict != Error || !strings.Contains(c.Detail, "not a directory") {
		t.Errorf("under a file: %+v", c)
	}
}

func TestDescriptorSetting(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Descriptor
		want string
		set  bool
	}{
		{"env", Descriptor{Args: []string{"kc-hook", "poststop"}, Env: []string{"KC_STATE_DIR=/e"}}, "/e", true},
		{"flag beats env", Descriptor{Args: []string{"kc-hook", "--state-dir=/f", "poststop"}, Env: []string{"KC_STATE_DIR=/e"}}, "/f", true},
		{"flag with a separate value", Descriptor{Args: []string{"kc-hook", "-state-dir", "/g", "poststop"}}, "/g", true},
		{"the stage is no value", Descriptor{Args: []string{"kc-hook", "--state-dir", "poststop"}}, "", false},
		{"nothing", Descriptor{Args: []string{"kc-hook", "poststop"}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set := tc.d.Setting("state-dir", "KC_STATE_DIR")
			if got != tc.want || set != tc.set {
				t.Errorf("Setting = %q, %v; want %q, %v", got, set, tc.want, tc.set)
			}
		})
	}
}

// TestDescriptorTimeoutAboveDeadline: the runtime's timeout must leave
// kc-hook its deadline (a pre-start stage killed by the runtime fails the
// container's start), and poststop 2 s more; the deadline is the
// descriptor's (flag, then variable, a bare number of seconds too) or
// kc-hook's default.
func TestDescriptorTimeoutAboveDeadline(t *testing.T) {
	hook := fakeHook(t)
	for _, tc := range []struct {
		name    string
		stage   string
		timeout int
		args    []string
		env     []string
		refused bool
	}{
		{"the shipped 30s", "poststop", 30, nil, nil, false},
		{"the default deadline", "createRuntime", 20, nil, nil, true},
		{"poststop's grace", "poststop", 22, nil, nil, true},
		{"poststop with room", "poststop", 23, nil, nil, false},
		{"a deadline in env", "createRuntime", 30, nil, []string{"KC_HOOK_DEADLINE=30s"}, true},
		{"in seconds", "createRuntime", 30, nil, []string{"KC_HOOK_DEADLINE=45"}, true},
		{"a short deadline", "createRuntime", 10, nil, []string{"KC_HOOK_DEADLINE=8s"}, false},
		{"the flag beats env", "createRuntime", 10, []string{"--deadline=8s"}, []string{"KC_HOOK_DEADLINE=60s"}, false},
		{"an unparsable deadline is the hook's to refuse", "createRuntime", 30, nil, []string{"KC_HOOK_DEADLINE=soon"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := map[string]any{
				"version": "1.0.0",
				"hook":    map[string]any{"path": hook, "args": append(append([]string{"kc-hook"}, tc.args...), tc.stage), "env": tc.env, "timeout": tc.timeout},
				"when":    map[string]any{"always": true},
				"stages":  []string{tc.stage},
			}
			data, _ := json.Marshal(d)
			got := ParseDescriptor("x.json", data)
			refused := slices.ContainsFunc(got.Problems, func(p string) bool { return strings.Contains(p, "is not above kc-hook's --deadline") })
			if refused != tc.refused || (!tc.refused && len(got.Problems) > 0) {
				t.Errorf("problems %q; want the timeout refused: %v", got.Problems, tc.refused)
			}
		})
	}
}

// TestDescriptorDeadlineLeavesTimeToLaunch: a stage that launches
// supervisors under a deadline no longer than what a launch needs left
// (kc-hook's LaunchMargin) would skip every launch: said (a warning; the
// descriptor still records); poststop launches nothing.
func TestDescriptorDeadlineLeavesTimeToLaunch(t *testing.T) {
	hook := fakeHook(t)
	for _, tc := range []struct {
		stage, deadline string
		refused         bool
	}{
		{"createRuntime", "7s", true},
		{"poststart", "5", true},
		{"createRuntime", "8s", false},
		{"poststop", "5s", false},
	} {
		t.Run(tc.stage+" "+tc.deadline, func(t *testing.T) {
			d := map[string]any{
				"version": "1.0.0",
				"hook":    map[string]any{"path": hook, "args": []string{"kc-hook", tc.stage}, "env": []string{"KC_HOOK_DEADLINE=" + tc.deadline}, "timeout": 30},
				"when":    map[string]any{"always": true},
				"stages":  []string{tc.stage},
			}
			data, _ := json.Marshal(d)
			got := ParseDescriptor("x.json", data)
			p := got.deadlineBelowLaunch(got.Stages)
			if refused := strings.Contains(p, "leaves no time to launch a supervisor"); refused != tc.refused || len(got.Problems) != 0 {
				t.Errorf("%q, problems %q; want the deadline said: %v, the descriptor valid", p, got.Problems, tc.refused)
			}
		})
	}
}

// TestDescriptorVariableSetTwice: a KC_* variable set twice in a
// descriptor's env is a problem: which value kc-hook gets depends on the
// runtime (runc the last, crun the first).
func TestDescriptorVariableSetTwice(t *testing.T) {
	hook := fakeHook(t)
	for _, tc := range []struct {
		env     []string
		problem bool
	}{
		{[]string{"KC_STATE_DIR=/a", "KC_HOOK_DEADLINE=10s"}, false},
		{[]string{"KC_HOOK_DEADLINE=10s", "KC_HOOK_DEADLINE=60s"}, true},
		{[]string{"PATH=/bin", "PATH=/usr/bin"}, false},
		{[]string{"KC_STATE_DIR=/a", "KC_STATE_DIR=/a"}, false},
	} {
		got := ParseDescriptor("x.json", []byte(descriptor(hook, "createRuntime", tc.env...)))
		twice := slices.ContainsFunc(got.Problems, func(p string) bool { return strings.Contains(p, "twice") })
		if twice != tc.problem {
			t.Errorf("env %q: problems %q; want a variable set twice: %v", tc.env, got.Problems, tc.problem)
		}
	}
}

// TestHookInstalledDefaultMismatch: a descriptor naming no state dir
// makes the hook use its own default, which need not be the janitor's
// (a janitor given --state-dir, or root's janitor reading a user's hooks).
func TestHookInstalledDefaultMismatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks.d")
	installPair(t, dir, fakeHook(t))
	got, _ := HookInstalled(context.Background(), []string{dir}, "/srv/kc", "/run/user/1001/kc-watchman")
	all := got.Detail + "\n" + strings.Join(got.Items, "\n")
	if got.Verdict != Warn || !strings.Contains(all, "its default /run/user/1001/kc-watchman") {
		t.Errorf("%v: %s", got.Verdict, all)
	}
	if got, _ := HookInstalled(context.Background(), []string{dir}, "/run/user/1001/kc-watchman", "/run/user/1001/kc-watchman"); got.Verdict != OK {
		t.Errorf("matching defaults: %+v", got)
	}
}

// TestHookInstalledElsewhere: descriptors installed where podman does not
// look (an older `make install` with PREFIX=/usr/local) are an error that
// names where they are and how to fix it; the dirs podman reads are named.
func TestHookInstalledElsewhere(t *testing.T) {
	misplaced := filepath.Join(t.TempDir(), "usr-local", "hooks.d")
	installPair(t, misplaced, fakeHook(t))
	saved := MisplacedHooksDirs
	MisplacedHooksDirs = []string{misplaced}
	t.Cleanup(func() { MisplacedHooksDirs = saved })

	read := filepath.Join(t.TempDir(), "hooks.d")
	got, _ := HookInstalled(context.Background(), []string{read}, "/run/kc-watchman", "/run/kc-watchman")
	all := got.Detail + "\n" + strings.Join(got.Items, "\n")
	if got.Verdict != Error || !strings.Contains(got.Detail, read) {
		t.Errorf("verdict %v, detail %q: want an error naming %s", got.Verdict, got.Detail, read)
	}
	if !strings.Contains(all, "kc-hook-poststop.json is in "+misplaced+", which podman does not read") {
		t.Errorf("the misplaced descriptors are not named:\n%s", all)
	}
	// Found where podman does read them, they are fine.
	if got, _ := HookInstalled(context.Background(), []string{misplaced}, "/run/kc-watchman", "/run/kc-watchman"); got.Verdict != OK {
		t.Errorf("descriptors in a dir podman reads: %v %s", got.Verdict, got.Detail)
	}
}

// Where podman is not an engine, a missing kc-hook is expected (Docker and
// containerd hosts have no hooks.d for it) and a broken one is a warning;
// where it is, both stay errors.
func TestHookWithoutPodman(t *testing.T) {
	state := "/run/kc-watchman"
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  Verdict
		text  string
	}{
		{"none installed", func(*testing.T, string) {}, OK, "none needed: no engine asked here runs hooks from hooks.d"},
		{"poststop missing", func(t *testing.T, dir string) {
			write(t, dir, "kc-hook-createruntime.json", descriptor(fakeHook(t), "createRuntime"))
		}, Warn, "no engine asked here runs hooks from hooks.d"},
		{"installed", func(t *testing.T, dir string) { installPair(t, dir, fakeHook(t)) }, OK, "poststop"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hooks.d")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			c.setup(t, dir)
			with, descs := HookInstalled(context.Background(), []string{dir}, state, state)
			got := HookWithoutPodman(with, descs)
			if got.Verdict != c.want || !strings.Contains(got.Text(), c.text) {
				t.Errorf("verdict %v (%s), want %v with %q", got.Verdict, got.Detail, c.want, c.text)
			}
			if c.want != OK && with.Verdict != Error {
				t.Errorf("with podman: verdict %v, want error", with.Verdict)
			}
		})
	}
}
