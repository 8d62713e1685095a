package engine

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestSocketPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "/run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{in: "unix:///run/crio/crio.sock", want: "/run/crio/crio.sock"},
		{in: "unix:///run//crio/../crio/crio.sock", want: "/run/crio/crio.sock"},
		{in: "/run//containerd/", want: "/run/containerd"},
		{in: "", bad: true},
		{in: "containerd.sock", bad: true},
		{in: "unix://", bad: true},
		{in: "tcp://127.0.0.1:1", bad: true},
		{in: "npipe:////./pipe/containerd", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := SocketPath(tc.in)
			if tc.bad {
				if !errors.Is(err, ErrSocketPath) {
					t.Fatalf("SocketPath(%q) = %q, %v; want ErrSocketPath", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("SocketPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// existingAsEnv makes the test binary a helper that prints, one per line,
// what Existing returns for the paths in the variable (":"-separated).
const existingAsEnv = "KC_TEST_ENGINE_EXISTING"

func TestMain(m *testing.M) {
	if paths, ok := os.LookupEnv(existingAsEnv); ok {
		for _, p := range Existing(strings.Split(paths, ":")) {
			os.Stdout.WriteString(p + "\n")
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestExistingForAnotherUser: root finds every socket path that exists,
// a dangling symlink too (asking refuses it, loudly); an ordinary user
// only those he may connect to, so that auto does not make each of his
// runs exit 3 on root's Docker or containerd socket.
func TestExistingForAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the check as another user")
	}
	dir := testutil.OpenTempDir(t, "kc-engine-test-", 0o755)
	path := func(name string) string { return filepath.Join(dir, name) }
	for name, mode := range map[string]os.FileMode{"open.sock": 0o666, "closed.sock": 0o660} {
		if err := os.WriteFile(path(name), nil, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path(name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(path("closed.sock"), path("link.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path("absent.sock"), path("dangling.sock")); err != nil {
		t.Fatal(err)
	}
	all := []string{path("open.sock"), path("closed.sock"), path("link.sock"), path("dangling.sock"), path("missing.sock")}
	if got, want := Existing(all), all[:4]; !slices.Equal(got, want) {
		t.Errorf("as root: %q, want %q", got, want)
	}

	cmd := testutil.SelfAsNobody(t, dir, "engine.test", existingAsEnv+"="+strings.Join(all, ":"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper as nobody: %v", err)
	}
	if got, want := strings.Fields(string(out)), all[:1]; !slices.Equal(got, want) {
		t.Errorf("as nobody: %q, want %q", got, want)
	}
}
