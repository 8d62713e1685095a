package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// hookFixture is a temp dir holding a kc-hook to install (from) and the
// node's directory to install it in (to).
func hookFixture(t *testing.T) (dir, from, to string) {
	t.Helper()
	dir = t.TempDir()
	from = filepath.Join(dir, "src-kc-hook")
	if err := os.WriteFile(from, []byte("#!binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	to = filepath.Join(dir, "opt")
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, from, to
}

// TestInstallHook: the init container's step copies kc-hook (executable)
// and writes the base spec with every kc-hook entry naming the node's
// path, the rest of the spec unchanged.
func TestInstallHook(t *testing.T) {
	dir, from, to := hookFixture(t)
	out := filepath.Join(dir, "spec.json")
	shipped := filepath.Join("..", "..", "contrib", "containerd", "base-runtime-spec.json")
	if code, o := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", "/opt/kc-watchman/kc-hook",
		"--base-spec", shipped, "--base-spec-out", out); code != 0 {
		t.Fatalf("exit %d: %s", code, o)
	}
	st, err := os.Stat(filepath.Join(to, "kc-hook"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("kc-hook installed %v %v, want mode 0755", st, err)
	}
	var got, want map[string]any
	for p, v := range map[string]*map[string]any{out: &got, shipped: &want} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	n := 0
	for _, stage := range got["hooks"].(map[string]any) {
		for _, h := range stage.([]any) {
			if p := h.(map[string]any)["path"]; p != "/opt/kc-watchman/kc-hook" {
				t.Errorf("hook path %v", p)
			}
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d hooks, want createRuntime and poststop", n)
	}
	delete(got, "hooks")
	delete(want, "hooks")
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("the rest of the spec changed:\n%s\n%s", g, w)
	}
	entries, _ := os.ReadDir(to)
	if len(entries) != 1 {
		t.Errorf("temporary files left in %s: %v", to, entries)
	}

	if code, _ := runJanitorCapture(t, "install-hook", "--to", to, "--base-spec", shipped); code != exitUsage {
		t.Errorf("--base-spec without --base-spec-out: exit %d, want 2", code)
	}
	if code, _ := runJanitorCapture(t, "install-hook", "--from", filepath.Join(dir, "missing"), "--to", to); code != exitFailed {
		t.Errorf("a missing kc-hook: exit %d, want 1", code)
	}
}

// TestInstallHookReplacesSymlinks: a kc-hook, base spec or descriptor name
// on the node that is a symlink is replaced by the file itself (temp file
// and rename); what the link named is never written.
func TestInstallHookReplacesSymlinks(t *testing.T) {
	dir, from, to := hookFixture(t)
	outside := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(outside, []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "spec.json")
	hooksDir := filepath.Join(dir, "hooks.d")
	if err := os.Mkdir(hooksDir, 0o755); err != nil {
		t.Fatal(err)
	}
	descriptor := filepath.Join(hooksDir, "kc-hook-poststop.json")
	for _, link := range []string{filepath.Join(to, "kc-hook"), out, descriptor} {
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
	}
	shipped := filepath.Join("..", "..", "contrib", "containerd", "base-runtime-spec.json")
	if code, o := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", "/opt/kc-watchman/kc-hook",
		"--base-spec", shipped, "--base-spec-out", out, "--descriptors", filepath.Join("..", "..", "hooks.d"), "--hooks-dir", hooksDir); code != 0 {
		t.Fatalf("exit %d: %s", code, o)
	}
	if data, _ := os.ReadFile(outside); string(data) != "root:x:0:0" {
		t.Errorf("the symlinks' target was written: %q", data)
	}
	for _, p := range []string{filepath.Join(to, "kc-hook"), out, descriptor} {
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s is not a regular file after the install: %v %v", p, fi, err)
		}
	}
}

// TestInstallHookAddsHooks: a node whose runtime handler has a base spec
// of its own keeps it. With --add-hooks, kc-hook's entries (as the shipped
// spec has them) are added after other tools' hooks, once, and nothing
// else changes: not the spec's rlimits, not its other hooks. Without it,
// such a spec is refused.
func TestInstallHookAddsHooks(t *testing.T) {
	const hookPath = "/opt/kc-watchman/kc-hook"
	_, from, to := hookFixture(t)
	// The shipped spec's entries, as every added one must read.
	var shipped struct {
		Hooks map[string][]map[string]any `json:"hooks"`
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "contrib", "containerd", "base-runtime-spec.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &shipped); err != nil {
		t.Fatal(err)
	}
	for _, list := range shipped.Hooks {
		for _, h := range list {
			h["path"] = hookPath
		}
	}
	const own = `{"ociVersion":"1.0.2","process":{"rlimits":[{"type":"RLIMIT_NOFILE","hard":65536,"soft":65536}]},
 "hooks":{"createRuntime":[{"path":"/usr/bin/nvidia-ctk","args":["nvidia-ctk","hook"]}]}}`
	for _, tc := range []struct {
		name, spec string
		add        bool
		code       int
		others     int // hooks of other tools kept
	}{
		{"own spec, added", own, true, exitOK, 1},
		{"own spec, refused without --add-hooks", own, false, exitFailed, 0},
		{"no hooks at all", `{"ociVersion":"1.0.2","process":{"rlimits":[]}}`, true, exitOK, 0},
		{"hooks null", `{"hooks":null}`, true, exitOK, 0},
		{"kc-hook already there: pointed, not added twice", `{"process":{"rlimits":[]},"hooks":{"createRuntime":[{"path":"/old/kc-hook","args":["kc-hook","createRuntime"],"env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"timeout":30}]}}`, true, exitOK, 0},
		{"hooks not an object", `{"hooks":[]}`, true, exitFailed, 0},
		{"a stage not a list", `{"hooks":{"poststop":{}}}`, true, exitFailed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := filepath.Join(t.TempDir(), "own.json")
			if err := os.WriteFile(in, []byte(tc.spec), 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "spec.json")
			args := []string{"install-hook", "--from", from, "--to", to, "--hook-path", hookPath, "--base-spec", in, "--base-spec-out", out}
			if tc.add {
				args = append(args, "--add-hooks")
			}
			code, o := runJanitorCapture(t, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, o)
			}
			if code != exitOK {
				if _, err := os.Stat(out); err == nil {
					t.Error("a refused spec was written")
				}
				return
			}
			var got, before map[string]any
			if err := json.Unmarshal(mustRead(t, out), &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(tc.spec), &before)
			hooks := got["hooks"].(map[string]any)
			others := 0
			for stage, list := range hooks {
				var mine []any
				for _, h := range list.([]any) {
					if h.(map[string]any)["path"] == hookPath {
						mine = append(mine, h)
					} else {
						others++
					}
				}
				if want := shipped.Hooks[stage]; len(want) == 0 || len(mine) != len(want) || !jsonEqual(mine[0], want[0]) {
					t.Errorf("%s: kc-hook entries %v, want %v", stage, mine, want)
				}
			}
			if len(hooks) != len(shipped.Hooks) || others != tc.others {
				t.Errorf("stages %v, %d other hooks (want %d)", hooks, others, tc.others)
			}
			delete(got, "hooks")
			delete(before, "hooks")
			if !jsonEqual(got, before) {
				t.Errorf("the rest of the spec changed:\n%v\n%v", got, before)
			}
		})
	}
	t.Run("the handler's own spec is not edited in place", func(t *testing.T) {
		own := filepath.Join(t.TempDir(), "own.json")
		if err := os.WriteFile(own, []byte(`{"hooks":{}}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, _ := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", hookPath,
			"--base-spec", own, "--base-spec-out", own, "--add-hooks"); code != exitUsage {
			t.Errorf("exit %d, want 2", code)
		}
		if string(mustRead(t, own)) != `{"hooks":{}}` {
			t.Error("the handler's own spec was changed")
		}
	})
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// TestInstallHookDescriptors: for a CRI-O node the init container writes
// kc-hook's descriptors, each naming the node's kc-hook and otherwise as
// hooks.d/ has them, beside an operator's own descriptor, which stays.
func TestInstallHookDescriptors(t *testing.T) {
	const hookPath = "/opt/kc-watchman/kc-hook"
	dir, from, to := hookFixture(t)
	hooksDir := filepath.Join(dir, "hooks.d")
	if err := os.Mkdir(hooksDir, 0o755); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(hooksDir, "nvidia.json")
	if err := os.WriteFile(theirs, []byte(`{"version":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	shipped := filepath.Join("..", "..", "hooks.d")
	if code, o := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", hookPath,
		"--descriptors", shipped, "--hooks-dir", hooksDir); code != exitOK {
		t.Fatalf("exit %d: %s", code, o)
	}
	want, _ := filepath.Glob(filepath.Join(shipped, "*.json"))
	if len(want) != 2 {
		t.Fatalf("hooks.d has %v", want)
	}
	for _, w := range want {
		var got, orig map[string]any
		if err := json.Unmarshal(mustRead(t, filepath.Join(hooksDir, filepath.Base(w))), &got); err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(mustRead(t, w), &orig)
		if p := got["hook"].(map[string]any)["path"]; p != hookPath {
			t.Errorf("%s names %v, want %s", filepath.Base(w), p, hookPath)
		}
		orig["hook"].(map[string]any)["path"] = hookPath
		if !jsonEqual(got, orig) {
			t.Errorf("%s changed beyond its path:\n%v\n%v", filepath.Base(w), got, orig)
		}
	}
	if string(mustRead(t, theirs)) != `{"version":"1.0.0"}` {
		t.Error("an operator's own descriptor was changed")
	}
	if entries, _ := os.ReadDir(hooksDir); len(entries) != 3 {
		t.Errorf("%s holds %d files, want the 2 descriptors and the operator's", hooksDir, len(entries))
	}

	// A set with a descriptor that is not kc-hook's is refused whole: one
	// stage's hook without the other's would record trees no poststop reaps.
	for _, tc := range []struct {
		name string
		set  map[string]string
	}{
		{"not kc-hook's", map[string]string{"x.json": `{"hook":{"path":"/usr/bin/nvidia-ctk"}}`}},
		{"half a set", map[string]string{"a.json": `{"hook":{"path":"/x/kc-hook"},"stages":["poststop"]}`, "b.json": `{"hook":{"path":"/usr/bin/nvidia-ctk"}}`}},
		{"one stage only", map[string]string{"a.json": `{"hook":{"path":"/x/kc-hook"},"stages":["createRuntime"]}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, out := t.TempDir(), t.TempDir()
			for name, body := range tc.set {
				if err := os.WriteFile(filepath.Join(set, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if code, o := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", hookPath,
				"--descriptors", set, "--hooks-dir", out); code != exitFailed {
				t.Errorf("exit %d: %s", code, o)
			}
			if entries, _ := os.ReadDir(out); len(entries) != 0 {
				t.Errorf("wrote %v of a refused set", entries)
			}
		})
	}
	t.Run("relative hook path", func(t *testing.T) {
		if code, _ := runJanitorCapture(t, "install-hook", "--from", from, "--to", "rel", "--hooks-dir", t.TempDir()); code != exitUsage {
			t.Errorf("exit %d, want 2", code)
		}
	})
}
