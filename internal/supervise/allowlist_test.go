package supervise

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

const goodAllowlist = `{
  "supervisors": {
    "kallichore": {
      "argv": ["/usr/local/bin/kcserver", "--container-id={{container_id}}", "--watch", "{{ init_pid }}"],
      "env": ["RUST_LOG=info", "KC_CONTAINER={{container_id}}"],
      "max_restarts": 2,
      "restart_delay": "250ms",
      "pdeathsig": "KILL"
    },
    "plain": {"argv": ["/bin/true"]}
  }
}`

func writeAllowlist(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "supervisors.json")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
	return p
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the allowlist must be root-owned")
	}
}

func TestResolve(t *testing.T) {
	needRoot(t)
	a, err := LoadAllowlist(writeAllowlist(t, goodAllowlist, 0o644))
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Resolve("kallichore", Vars{ContainerID: cid, InitPID: 4242})
	if err != nil {
		t.Fatal(err)
	}
	wantArgv := []string{"/usr/local/bin/kcserver", "--container-id=" + cid, "--watch", "4242"}
	if !slices.Equal(c.Argv, wantArgv) {
		t.Errorf("argv = %q, want %q", c.Argv, wantArgv)
	}
	if want := []string{"RUST_LOG=info", "KC_CONTAINER=" + cid}; !slices.Equal(c.Env, want) {
		t.Errorf("env = %q, want %q", c.Env, want)
	}
	if c.MaxRestarts != 2 || c.RestartDelay != 250*time.Millisecond || c.PdeathSig != syscall.SIGKILL {
		t.Errorf("got %+v", c)
	}

	d, err := a.Resolve("plain", Vars{ContainerID: cid, InitPID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.MaxRestarts != DefaultMaxRestarts || d.RestartDelay != DefaultRestartDelay || d.PdeathSig != DefaultPdeathSig {
		t.Errorf("defaults not applied: %+v", d)
	}

	for _, name := range []string{"nope", "", "../kallichore", "kallichore; rm -rf /", "/bin/sh", strings.Repeat("a", 65)} {
		if _, err := a.Resolve(name, Vars{ContainerID: cid}); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Resolve(%q) = %v, want ErrNotAllowed", name, err)
		}
	}
}

func TestParseAllowlistRejects(t *testing.T) {
	tests := map[string]string{
		"not json":            `{`,
		"trailing data":       `{"supervisors":{}} {}`,
		"unknown field":       `{"supervisors":{"a":{"argv":["/bin/true"],"max_restart":1}}}`,
		"unknown top field":   `{"supervisor":{}}`,
		"empty argv":          `{"supervisors":{"a":{"argv":[]}}}`,
		"relative argv0":      `{"supervisors":{"a":{"argv":["kcserver"]}}}`,
		"placeholder argv0":   `{"supervisors":{"a":{"argv":["/bin/{{container_id}}"]}}}`,
		"unknown placeholder": `{"supervisors":{"a":{"argv":["/bin/x","{{bundle}}"]}}}`,
		"bad env":             `{"supervisors":{"a":{"argv":["/bin/x"],"env":["NOEQUALS"]}}}`,
		"bad env key":         `{"supervisors":{"a":{"argv":["/bin/x"],"env":["A-B=1"]}}}`,
		"negative restarts":   `{"supervisors":{"a":{"argv":["/bin/x"],"max_restarts":-1}}}`,
		"bad delay":           `{"supervisors":{"a":{"argv":["/bin/x"],"restart_delay":"soon"}}}`,
		"bad signal":          `{"supervisors":{"a":{"argv":["/bin/x"],"pdeathsig":"STOP"}}}`,
		"bad name":            `{"supervisors":{"../x":{"argv":["/bin/x"]}}}`,
		"NUL":                 `{"supervisors":{"a":{"argv":["/bin/x","a\u0000b"]}}}`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseAllowlist([]byte(in)); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestLoadAllowlistTrust(t *testing.T) {
	needRoot(t)
	t.Run("group writable file", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o664)
		if _, err := LoadAllowlist(p); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("world writable file", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o646)
		if _, err := LoadAllowlist(p); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("not root-owned", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o644)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadAllowlist(p); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("writable directory", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o644)
		if err := os.Chmod(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadAllowlist(p); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o644)
		link := filepath.Join(filepath.Dir(p), "link.json")
		if err := os.Symlink(p, link); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadAllowlist(link); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("directory instead of file", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o644)
		if _, err := LoadAllowlist(filepath.Dir(p)); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("relative path", func(t *testing.T) {
		if _, err := LoadAllowlist("supervisors.json"); !errors.Is(err, ErrUntrusted) {
			t.Fatalf("err = %v, want ErrUntrusted", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "none.json")
		if _, err := LoadAllowlist(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v, want ErrNotExist", err)
		}
	})
	t.Run("read-only 0600 is fine", func(t *testing.T) {
		p := writeAllowlist(t, goodAllowlist, 0o600)
		if _, err := LoadAllowlist(p); err != nil {
			t.Fatal(err)
		}
	})
}

func TestArgvRoundTrip(t *testing.T) {
	spec := Spec{ContainerID: cid, Command: []string{"/bin/kcserver", "--", "supervise", "x"}}
	spec.Init.PID, spec.Init.StartTicks = 1234, 987654
	argv := Argv("/usr/local/libexec/oci/hooks.d/kc-hook", WrapperFlags{StateDir: "/run/kc-watchman", KillGrace: 5 * time.Second, MaxRestarts: 3, RestartDelay: time.Second, PdeathSig: "TERM"}, spec)
	if !slices.Contains(argv, cid) {
		t.Fatalf("container ID is not a whole argv element: %q", argv)
	}
	got, err := ParseArgv(argv)
	if err != nil {
		t.Fatal(err)
	}
	if got.ContainerID != cid || got.Init.PID != 1234 || got.Init.StartTicks != 987654 || !slices.Equal(got.Command, spec.Command) {
		t.Fatalf("round trip: got %+v from %q", got, argv)
	}
	for _, bad := range [][]string{
		nil,
		{"kc-hook", "createRuntime"},
		{"kcserver", cid, "1", "2", "--", "x"}, // no "supervise"
		{"kc-hook", "supervise", cid, "1", "2", "--"},           // no command
		{"kc-hook", "supervise", cid[:12], "1", "2", "--", "x"}, // short ID
		{"kc-hook", "supervise", cid, "0", "2", "--", "x"},      // bad pid
		{"kc-hook", "supervise", cid, "5", "zz", "--", "x"},     // bad ticks
	} {
		if _, err := ParseArgv(bad); err == nil {
			t.Errorf("ParseArgv(%q) succeeded", bad)
		}
	}
}

func TestBackoff(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for n, w := range want {
		if got := Backoff(time.Second, 10*time.Second, n); got != w {
			t.Errorf("Backoff(1s, 10s, %d) = %v, want %v", n, got, w)
		}
	}
	if got := Backoff(time.Second, time.Minute, 1000); got != time.Minute {
		t.Errorf("Backoff(.., 1000) = %v, want the cap", got)
	}
}
