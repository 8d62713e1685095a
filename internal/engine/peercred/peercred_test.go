package peercred

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestMain doubles as a listener run under another UID: the child listens
// on $PEERCRED_LISTEN until killed.
func TestMain(m *testing.M) {
	if p := os.Getenv("PEERCRED_DIAL"); p != "" {
		// Dial as whoever runs this, and print the error.
		if _, _, err := DialUnixAs(context.Background(), "podman's API socket", p); err != nil {
			os.Stdout.WriteString(err.Error())
		}
		os.Exit(0)
	}
	if p := os.Getenv("PEERCRED_LISTEN"); p != "" {
		l, err := net.Listen("unix", p)
		if err != nil {
			os.Exit(3)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(4)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func TestDialUnix(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "engine.sock")
	listen(t, sock)
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		wantUID    int
		wantErr    string
	}{
		{"socket", sock, os.Geteuid(), ""},
		{"symlink to the socket", link, -1, "symlink"},
		{"regular file", file, -1, "not a socket"},
		{"missing", filepath.Join(dir, "none.sock"), -1, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, uid, err := DialUnix(t.Context(), tc.path)
			if tc.wantErr != "" {
				if err == nil || !contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if tc.name == "symlink to the socket" && !errors.Is(err, ErrSymlink) {
					t.Fatalf("err = %v, want ErrSymlink", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if uid != tc.wantUID {
				t.Fatalf("uid = %d, want %d", uid, tc.wantUID)
			}
		})
	}
}

// TestPeerIsTheListenerNotTheFileOwner: a socket file chowned to root but
// served by nobody vouches for nobody.
func TestPeerIsTheListenerNotTheFileOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a listener as another UID")
	}
	// The other user must reach both the test binary and the socket's
	// directory.
	dir := testutil.OpenTempDir(t, "peercred-", 0o777)
	sock := filepath.Join(dir, "other.sock")
	cmd := testutil.SelfAsNobody(t, dir, "listener", "PEERCRED_LISTEN="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Lstat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("listener did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.Chown(sock, 0, 0); err != nil {
		t.Fatal(err)
	}
	tr := NewTransport(sock)
	c, err := tr.DialContext(t.Context(), "unix", "x")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if uid, err := tr.UID(); err != nil || uid != 65534 {
		t.Fatalf("UID() = %d, %v; want 65534 (the listener), not the file's owner 0", uid, err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestDialErrorWords: a socket that cannot be connected to is named by
// its own path, never the /proc/self/fd one dialled, with the cause in
// words and what to do about it.
func TestDialErrorWords(t *testing.T) {
	// The other user must reach both the test binary and the socket's
	// directory.
	dir := testutil.OpenTempDir(t, "peercred-", 0o777)
	closed := filepath.Join(dir, "closed.sock") // bound once, nobody listens
	l, err := net.Listen("unix", closed)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	locked := filepath.Join(dir, "locked.sock") // listening, mode 000
	listen(t, locked)
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, path string
		want       string
	}{
		{"refused", closed, "cannot connect to podman's API socket " + closed + ": connection refused (nothing listens on it"},
		{"missing", filepath.Join(dir, "none.sock"), "cannot connect to podman's API socket " + filepath.Join(dir, "none.sock") + ": no such file or directory"},
		{"permission denied", locked, "cannot connect to podman's API socket " + locked + ": permission denied (run as root or as the socket's owner)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var msg string
			if tc.name == "permission denied" && os.Geteuid() == 0 {
				// Root may connect anywhere: dial as nobody.
				msg = dialAsNobody(t, dir, tc.path)
			} else {
				_, _, err := DialUnixAs(t.Context(), "podman's API socket", tc.path)
				var de *DialError
				if !errors.As(err, &de) {
					t.Fatalf("err = %v (%T), want a *DialError", err, err)
				}
				msg = err.Error()
			}
			if !strings.Contains(msg, tc.want) || strings.Contains(msg, "/proc/self/fd") {
				t.Errorf("error %q, want %q and no /proc/self/fd", msg, tc.want)
			}
		})
	}
	if got := Cause(syscall.EACCES); got != "permission denied (run as root or as the socket's owner)" {
		t.Errorf("EACCES: %q", got)
	}
}

// dialAsNobody runs this test's binary as nobody to dial path and returns
// the error it printed.
func dialAsNobody(t *testing.T, dir, path string) string {
	t.Helper()
	cmd := testutil.SelfAsNobody(t, dir, "dialer", "PEERCRED_DIAL="+path)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dialling as nobody: %v", err)
	}
	return string(out)
}
