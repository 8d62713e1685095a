package podman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// These tests need no podman: the API is a missing or a silent socket, the
// CLI a shell script.

// writeScript writes an executable shell script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// silentSocket listens on a Unix socket, accepts connections and never
// answers: a hung podman service.
func silentSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	})
}

func TestQueryNothingAnswersIsUnknownQuickly(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	set, err := Query(t.Context(), Options{
		URL:       "unix://" + filepath.Join(dir, "absent.sock"),
		PodmanBin: filepath.Join(dir, "no-such-podman"),
		Timeout:   10 * time.Second,
		Logger:    testLogger(t),
	})
	took := time.Since(start)
	if !errors.Is(err, engine.ErrUnknown) {
		t.Fatalf("Query = %+v, %v; want ErrUnknown", set, err)
	}
	t.Logf("took %v: %v", took, err)
	// A missing socket and a missing binary need no timeout.
	if took > 2*time.Second {
		t.Errorf("took %v; a refused connect and a missing CLI should fail fast", took)
	}
}

func TestQueryCLIFallbackFailures(t *testing.T) {
	dir := t.TempDir()
	url := "unix://" + filepath.Join(dir, "absent.sock")
	for _, tt := range []struct{ name, body string }{
		{"exit status", "echo 'Error: cannot connect' >&2; exit 125\n"},
		{"garbage", "echo 'this is not json'\n"},
		{"empty output", "exit 0\n"},
		{"truncated IDs", `echo '[{"Id":"f42f18001b73","State":"running"}]'` + "\n"},
		// An empty list, were it read to its end.
		{"more than the cap", "printf '['; head -c 67108865 /dev/zero | tr '\\0' ' '; echo ']'\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bin := writeScript(t, t.TempDir(), "podman", tt.body)
			_, err := Query(t.Context(), Options{URL: url, PodmanBin: bin, Timeout: 5 * time.Second})
			if !errors.Is(err, engine.ErrUnknown) {
				t.Fatalf("err = %v, want ErrUnknown", err)
			}
			t.Log(err)
		})
	}
}

func TestQueryCLIFallbackAsksTheSameService(t *testing.T) {
	dir := t.TempDir()
	argsFile := filepath.Join(dir, "args")
	bin := writeScript(t, dir, "podman", `echo "$@" > `+argsFile+`
echo "CONTAINER_HOST=$CONTAINER_HOST" >> `+argsFile+`
cat <<'EOF'
[{"Id":"`+id('a')+`","State":"running","Status":"Up 1 minute"},
 {"Id":"`+id('b')+`","State":"exited","Status":"Up 1 minute"}]
EOF
`)
	url := "unix://" + filepath.Join(dir, "absent.sock")
	t.Setenv("CONTAINER_HOST", "unix:///somewhere/else.sock")

	set, err := Query(t.Context(), Options{URL: url, PodmanBin: bin, Timeout: 5 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if set.Source != engine.SourceCLI || !set.IsLive(id('a')) || set.IsLive(id('b')) || set.States[id('b')] != "exited" {
		t.Errorf("set = %+v", set)
	}
	// A non-default socket: the CLI is pointed at it, not at its own store,
	// and CONTAINER_HOST does not leak into it.
	got, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	want := "--url " + url + " ps --all --no-trunc --format json\nCONTAINER_HOST=\n"
	if string(got) != want {
		t.Errorf("CLI got %q, want %q", got, want)
	}
	// The socket cannot be stat'ed (nobody listens there): owner unknown.
	if set.UID != engine.UIDUnknown {
		t.Errorf("UID = %d, want %d", set.UID, engine.UIDUnknown)
	}

	// Explicit CLIArgs are used verbatim; the CLI's UID is this process's.
	set, err = Query(t.Context(), Options{URL: url, PodmanBin: bin, CLIArgs: []string{"--root", "/x"}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(argsFile)
	if !strings.HasPrefix(string(got), "--root /x ps --all") {
		t.Errorf("CLI got %q", got)
	}
	if set.UID != os.Geteuid() {
		t.Errorf("UID = %d, want %d", set.UID, os.Geteuid())
	}
}

func TestQueryHangingAPIAndCLIIsUnknownWithinTimeout(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hung.sock")
	silentSocket(t, sock)
	bin, childGone := holdingCLI(t, "")

	const timeout = 2 * time.Second
	start := time.Now()
	_, err := Query(t.Context(), Options{URL: "unix://" + sock, PodmanBin: bin, Timeout: timeout, Logger: testLogger(t)})
	took := time.Since(start)
	if !errors.Is(err, engine.ErrUnknown) {
		t.Fatalf("err = %v, want ErrUnknown", err)
	}
	t.Logf("took %v: %v", took, err)
	if took > timeout+time.Second {
		t.Errorf("took %v with a %v timeout", took, timeout)
	}
	childGone()
}

// holdingCLI writes a podman CLI that prints first, then leaves a child
// holding its output and waits for it: killing the script alone would
// leave the pipe open and the reader waiting. childGone, called after the
// query, checks that the query's kill took the child too; a child still
// running at cleanup is killed, through a pidfd of the sleep it was.
func holdingCLI(t *testing.T, first string) (bin string, childGone func()) {
	t.Helper()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	bin = writeScript(t, dir, "podman", first+"sleep 300 &\necho $! > "+pidFile+"\nwait\n")
	t.Cleanup(func() {
		if !testutil.PathExists(pidFile) {
			return
		}
		pid := testutil.ReadPID(t, pidFile)
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		if st, err := fingerprint.ReadStat("/proc", pid); err == nil && st.Comm == "sleep" {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
	})
	return bin, func() {
		t.Helper()
		if !testutil.PathExists(pidFile) {
			t.Fatal("the CLI never ran")
		}
		pid := testutil.ReadPID(t, pidFile)
		proc.WaitFor(t, 5*time.Second, "the CLI's child to die", func() bool { return proc.Dead(pid) })
	}
}

func TestQueryHangingAPILeavesTimeForCLI(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hung.sock")
	silentSocket(t, sock)
	bin := writeScript(t, dir, "podman", `echo '[{"Id":"`+id('c')+`","State":"paused"}]'`+"\n")

	const timeout = 3 * time.Second
	start := time.Now()
	set, err := Query(t.Context(), Options{URL: "unix://" + sock, PodmanBin: bin, Timeout: timeout})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Query: %v (after %v)", err, took)
	}
	if set.Source != engine.SourceCLI || !set.IsLive(id('c')) {
		t.Errorf("set = %+v", set)
	}
	// The CLI asked the service via --url: we never saw the connection
	// that answered, and the socket's path could have been swapped under
	// it, so the answer vouches for no UID.
	if set.UID != engine.UIDUnknown {
		t.Errorf("UID = %d, want %d: a stat of the path is no proof of who answered", set.UID, engine.UIDUnknown)
	}
	t.Logf("took %v", took)
	if took > timeout {
		t.Errorf("took %v with a %v timeout", took, timeout)
	}
}

func TestQueryRespectsParentContext(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hung.sock")
	silentSocket(t, sock)
	bin := writeScript(t, dir, "podman", "exec sleep 300\n")
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Query(ctx, Options{URL: "unix://" + sock, PodmanBin: bin, Timeout: time.Minute})
	if !errors.Is(err, engine.ErrUnknown) {
		t.Fatalf("err = %v, want ErrUnknown", err)
	}
	t.Log(err)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %v; the caller's context expired after 0.5s", took)
	}
}

// TestVersionCLI: with no service to ask, Version asks the CLI as every
// query does: its first line only, and nothing of it outlives the deadline.
func TestVersionCLI(t *testing.T) {
	absent := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	version := func(t *testing.T, bin string, timeout time.Duration) (string, error) {
		e, err := New(engine.Config{PodmanURL: absent, PodmanBin: bin, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		return e.(*podman).Version(t.Context())
	}
	for _, tc := range []struct{ name, body, want string }{
		{"its version", "echo 'podman version 4.3.1'\n", "4.3.1 (CLI)"},
		{"a first line, then 8 MiB", "echo 'podman version 4.3.1'; head -c 8388608 /dev/zero | tr '\\0' x\n", "4.3.1 (CLI)"},
		{"nothing", "exit 0\n", ""},
		{"an exit status", "echo 'podman version 4.3.1'; exit 125\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := version(t, writeScript(t, t.TempDir(), "podman", tc.body), 5*time.Second)
			if got != tc.want || (err == nil) != (tc.want != "") {
				t.Errorf("Version = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("a child holds its output", func(t *testing.T) {
		bin, childGone := holdingCLI(t, "echo 'podman version 4.3.1'\n")
		const timeout = 2 * time.Second
		start := time.Now()
		got, err := version(t, bin, timeout)
		if took := time.Since(start); err == nil || took > timeout+time.Second {
			t.Errorf("Version = %q, %v after %v; want an error within the %v timeout", got, err, took, timeout)
		}
		childGone()
	})
}

// TestLiveOfFromTheCLIIsWhole: asked about some containers with no API
// service, podman answers through the CLI, which lists every container:
// the answer says it is whole, so engine.AskAbout takes it as it is.
func TestLiveOfFromTheCLIIsWhole(t *testing.T) {
	id := strings.Repeat("a", 64)
	bin := writeScript(t, t.TempDir(), "podman", fmt.Sprintf(`echo '[{"Id":"%s","State":"running"}]'`+"\n", id))
	e, err := New(engine.Config{PodmanURL: "unix://" + filepath.Join(t.TempDir(), "absent.sock"), PodmanBin: bin, PodmanArgs: []string{}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, whole, err := e.(engine.Narrower).LiveOf(t.Context(), []string{strings.Repeat("b", 64)})
	if err != nil {
		t.Fatal(err)
	}
	if !whole || a.Source != engine.SourceCLI || len(a.Containers) != 1 || a.Containers[0].ID != id {
		t.Errorf("whole %v, %+v: want the CLI's whole list", whole, a)
	}
}
