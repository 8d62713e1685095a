package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestInstallHook: the init container's step copies kc-hook (executable)
// and writes the base spec with every kc-hook entry naming the node's
// path, the rest of the spec unchanged.
func TestInstallHook(t *testing.T) {
	dir := t.TempDir()
	from := filepath.Join(dir, "src-kc-hook")
	if err := os.WriteFile(from, []byte("#!binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "opt")
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
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

// TestInstallHookReplacesSymlinks: a kc-hook or base spec name on the node
// that is a symlink is replaced by the file itself (temp file and
// rename); what the link named is never written.
func TestInstallHookReplacesSymlinks(t *testing.T) {
	dir := t.TempDir()
	from := filepath.Join(dir, "src-kc-hook")
	if err := os.WriteFile(from, []byte("#!binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "opt")
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(outside, []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "spec.json")
	for _, link := range []string{filepath.Join(to, "kc-hook"), out} {
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
	}
	shipped := filepath.Join("..", "..", "contrib", "containerd", "base-runtime-spec.json")
	if code, o := runJanitorCapture(t, "install-hook", "--from", from, "--to", to, "--hook-path", "/opt/kc-watchman/kc-hook",
		"--base-spec", shipped, "--base-spec-out", out); code != 0 {
		t.Fatalf("exit %d: %s", code, o)
	}
	if data, _ := os.ReadFile(outside); string(data) != "root:x:0:0" {
		t.Errorf("the symlinks' target was written: %q", data)
	}
	for _, p := range []string{filepath.Join(to, "kc-hook"), out} {
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s is not a regular file after the install: %v %v", p, fi, err)
		}
	}
}
