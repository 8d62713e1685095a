package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestContainerdHandlers(t *testing.T) {
	const hooked = `{"hooks":{"createRuntime":[{"path":"/usr/local/libexec/oci/hooks.d/kc-hook"}],"poststop":[{"path":"/usr/local/libexec/oci/hooks.d/kc-hook"}]}}`
	const other = `{"hooks":{"poststop":[{"path":"/usr/bin/other-hook"}]}}`
	for _, tc := range []struct {
		name   string
		config string
		files  map[string]string
		// descriptors: hooks.d has kc-hook's (the check starts ok, not
		// at Error); badDescriptors: it has them, and they are an error
		// (one another user may write).
		descriptors, badDescriptors bool
		verdict                     Verdict
		items                       []string
	}{
		{
			name: "a carrying handler does not excuse a bad descriptor",
			config: `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/kc.json"
`,
			files:       map[string]string{"/etc/containerd/kc.json": hooked, "/usr/local/libexec/oci/hooks.d/kc-hook": "#!/bin/sh\n"},
			descriptors: true, badDescriptors: true,
			verdict: Error,
			items:   []string{"handler runc: kc-hook"},
		},
		{
			name: "v2 runc carries, kata has no base spec",
			config: `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/kc.json"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
  runtime_type = "io.containerd.kata.v2"
`,
			files:   map[string]string{"/etc/containerd/kc.json": hooked, "/usr/local/libexec/oci/hooks.d/kc-hook": "#!/bin/sh\n"},
			verdict: Warn,
			items:   []string{"handler kata: no base_runtime_spec", "handler runc: kc-hook at createRuntime, poststop"},
		},
		{
			name: "v3 every handler carries",
			config: `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/kc.json"
`,
			files:   map[string]string{"/etc/containerd/kc.json": hooked, "/usr/local/libexec/oci/hooks.d/kc-hook": "#!/bin/sh\n"},
			verdict: OK,
			items:   []string{"handler runc: kc-hook"},
		},
		{
			name: "base spec without kc-hook",
			config: `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/other.json"
`,
			files:   map[string]string{"/etc/containerd/other.json": other},
			verdict: Error,
			items:   []string{"handler runc: its base spec names no kc-hook"},
		},
		{
			// runc cannot run it: every container of the handler fails.
			name: "kc-hook named but not on the node",
			config: `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/kc.json"
`,
			files:       map[string]string{"/etc/containerd/kc.json": hooked},
			descriptors: true, // podman's are fine: the node's containerd is not
			verdict:     Error,
			items:       []string{"handler runc: its base spec names kc-hook at /usr/local/libexec/oci/hooks.d/kc-hook, which cannot be run here"},
		},
		{
			// runc kills a createRuntime stage still within its deadline:
			// the container fails to start.
			name: "a timeout not above kc-hook's deadline",
			config: `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/kc.json"
`,
			files: map[string]string{"/etc/containerd/kc.json": `{"hooks":{"createRuntime":[{"path":"/usr/local/libexec/oci/hooks.d/kc-hook","timeout":20}]}}`,
				"/usr/local/libexec/oci/hooks.d/kc-hook": "#!/bin/sh\n"},
			descriptors: true,
			verdict:     Error,
			items:       []string{"handler runc: its base spec's hook.timeout 20s is not above kc-hook's --deadline 20s"},
		},
		{
			name: "base spec missing",
			config: `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  base_runtime_spec = "/etc/containerd/gone.json"
`,
			verdict: Error,
			items:   []string{"handler runc: base spec unreadable"},
		},
		{name: "not toml", config: "[[[", verdict: Error, items: []string{"containerd: /etc/containerd/config.toml"}},
		{name: "no containerd config", verdict: Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write := func(p, s string) {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
					t.Fatal(err)
				}
				mode := os.FileMode(0o644)
				if strings.HasPrefix(s, "#!") {
					mode = 0o755
				}
				if err := os.WriteFile(filepath.Join(root, p), []byte(s), mode); err != nil {
					t.Fatal(err)
				}
			}
			if tc.config != "" {
				write(ContainerdConfigs[0], tc.config)
			}
			for p, s := range tc.files {
				write(p, s)
			}
			from := Error
			if tc.descriptors {
				from = OK
			}
			if tc.badDescriptors {
				from = Error
			}
			c := WithContainerdHandlers(newCheck(NameHookInstalled, from, "descriptors"), root, !tc.descriptors)
			if c.Verdict != tc.verdict {
				t.Errorf("verdict %v (%s), want %v", c.Verdict, c.Text(), tc.verdict)
			}
			if len(c.Items) != len(tc.items) {
				t.Fatalf("items %q, want %d like %q", c.Items, len(tc.items), tc.items)
			}
			for i, want := range tc.items {
				if !strings.Contains(c.Items[i], want) {
					t.Errorf("item %q lacks %q", c.Items[i], want)
				}
			}
		})
	}
}

// TestRunnable: a hook path is judged as runc would run it on the node:
// absolute, a regular executable file, symlinks resolved inside the
// node's root (an absolute one names the node's file, not ours).
func TestRunnable(t *testing.T) {
	root := t.TempDir()
	mk := func(p string, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("/opt/kc/kc-hook", 0o755)
	mk("/opt/noexec/kc-hook", 0o644)
	if err := os.MkdirAll(filepath.Join(root, "/opt/dir/kc-hook"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Absolute targets: inside the root they name root's /opt/kc/kc-hook;
	// followed on this host they would name a file that is not there.
	if err := os.MkdirAll(filepath.Join(root, "/usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/kc/kc-hook", filepath.Join(root, "/usr/bin/kc-hook")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "opt/kc/kc-hook"), filepath.Join(root, "/usr/bin/escaping-kc-hook")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/opt/kc/kc-hook", true},
		{"/usr/bin/kc-hook", true},
		{"/usr/bin/escaping-kc-hook", false}, // its target is read inside the root, where it is not
		{"/opt/noexec/kc-hook", false},
		{"/opt/dir/kc-hook", false},
		{"/opt/missing/kc-hook", false},
		{"opt/kc/kc-hook", false},
	} {
		if err := runnable(root, tc.path); (err == nil) != tc.ok {
			t.Errorf("runnable(%s) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
}
