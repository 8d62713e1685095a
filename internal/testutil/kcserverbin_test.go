package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

func get(t *testing.T, socket, path string, timeout time.Duration) (map[string]any, error) {
	t.Helper()
	c := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://localhost" + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(data, &m)
}

func waitGone(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for PathExists(p) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists", p)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFakeServesStatusAndSessions(t *testing.T) {
	dir := t.TempDir()
	k := StartKCServer(t, dir, Fake{Children: 2, Stubborn: true, OpenChannels: true})

	id, err := fingerprint.Read(fingerprint.DefaultRoot, k.PID)
	if err != nil {
		t.Fatal(err)
	}
	if id.Comm != "kcserver" {
		t.Errorf("comm %q, want kcserver", id.Comm)
	}
	if id.SID != k.PID || id.PGID != k.PID {
		t.Errorf("sid %d pgid %d, want both %d (its launcher made it a session leader)", id.SID, id.PGID, k.PID)
	}
	if want := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", k.PID)); k.Socket != want {
		t.Errorf("control socket %s, want %s", k.Socket, want)
	}
	if len(k.Children) != 3 {
		t.Fatalf("%d children, want 3", len(k.Children))
	}
	for _, c := range k.Children {
		if c.PGID != k.PID {
			t.Errorf("child %d in group %d, want %d", c.PID, c.PGID, k.PID)
		}
	}

	st, err := get(t, k.Socket, "/status", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sessions", "active", "busy", "idle_seconds", "busy_seconds", "uptime_seconds", "version", "process_id", "started"}
	for _, f := range want {
		if _, ok := st[f]; !ok {
			t.Errorf("status lacks %q: %v", f, st)
		}
	}
	if len(st) != len(want) {
		t.Errorf("status has %d fields, want 0.1.64's %d: %v", len(st), len(want), st)
	}
	if int(st["process_id"].(float64)) != k.PID {
		t.Errorf("process_id %v, want %d", st["process_id"], k.PID)
	}
	ss, err := get(t, k.Socket, "/sessions", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ss["total"].(float64) != 1 || len(ss["sessions"].([]any)) != 1 {
		t.Fatalf("sessions: %v", ss)
	}
	sess := ss["sessions"].([]any)[0].(map[string]any)
	sessSock := filepath.Join(dir, fmt.Sprintf("kc-%d.%s.sock", k.PID, sess["session_id"].(string)[:8]))
	if sess["socket_path"] != sessSock {
		t.Errorf("socket_path %v, want %s", sess["socket_path"], sessSock)
	}
	// The channel socket listens but speaks no HTTP.
	if _, err := get(t, sessSock, "/status", 300*time.Millisecond); err == nil {
		t.Error("session socket answered HTTP")
	}
	c, err := net.Dial("unix", sessSock)
	if err != nil {
		t.Fatalf("session socket: %v", err)
	}
	c.Close()

	// SIGTERM: sockets unlinked, children survive.
	if err := k.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	k.Wait(t)
	waitGone(t, k.Socket)
	waitGone(t, sessSock)
	for _, c := range k.Children {
		if !fingerprint.Alive(fingerprint.DefaultRoot, c) {
			t.Errorf("child %d died with its supervisor", c.PID)
		}
	}
}

func TestFakeSIGKILLLeavesSockets(t *testing.T) {
	dir := t.TempDir()
	k := StartKCServer(t, dir, Fake{OpenChannels: true})
	k.Kill(t)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("after SIGKILL: %d entries, want 2 sockets left behind", len(ents))
	}
	_, err := get(t, k.Socket, "/status", time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect to orphan socket: %v, want ECONNREFUSED", err)
	}
}

// runFake runs the fake to completion (or for at most 2s) and returns its
// exit status and stderr.
func runFake(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, BuildKCServer(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		return -1, stderr.String()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// TestFakeCommandLine: the flag set is real kcserver's; anything else
// exits 2 at once, the way clap does, which is what a wrapper restarting
// it would see.
func TestFakeCommandLine(t *testing.T) {
	const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"container-id is not a kcserver flag", []string{"--transport=socket", "--container-id=" + cid}, 2},
		{"bare container id", []string{"--transport", "socket", cid}, 2},
		{"single-dash long flag", []string{"-socket-dir=/tmp"}, 2},
		{"old fake's test flag", []string{"--children=2"}, 2},
		{"bad transport", []string{"--transport=unix"}, 2},
		{"value missing", []string{"--socket-dir"}, 2},
		{"idle hours not a number", []string{"--idle-shutdown-hours", "x"}, 2},
		{"help", []string{"--help"}, 0},
		{"version", []string{"-V"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr := runFake(t, nil, tt.args...)
			if code != tt.want {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.want, stderr)
			}
		})
	}
}

// TestFakeSocketPlaces: where the control and session sockets go, and
// that the default transport (no --transport, no --connection-file) is
// TCP, with no socket anywhere.
func TestFakeSocketPlaces(t *testing.T) {
	tests := []struct {
		name        string
		socketDir   bool     // pass --socket-dir
		transport   []string // how the transport is chosen
		xdg, tmp    bool     // set XDG_RUNTIME_DIR, TMPDIR
		wantControl string   // "dir", "xdg", "tmp" or "" (TCP)
		wantSession string
	}{
		{"socket-dir wins", true, []string{"--transport=socket"}, true, true, "dir", "dir"},
		{"XDG_RUNTIME_DIR for control, temp dir for sessions", false, []string{"--transport", "socket"}, true, true, "xdg", "tmp"},
		{"TMPDIR without XDG", false, []string{"--transport=socket"}, false, true, "tmp", "tmp"},
		{"connection file implies socket", true, []string{"--connection-file=CONN"}, false, false, "dir", "dir"},
		{"default transport is TCP", true, nil, true, true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dirs := map[string]string{"dir": shortDir(t), "xdg": shortDir(t), "tmp": shortDir(t)}
			var f Fake
			f.OpenChannels = true
			f.Env = []string{"XDG_RUNTIME_DIR=", "TMPDIR="}
			if tt.xdg {
				f.Env = append(f.Env, "XDG_RUNTIME_DIR="+dirs["xdg"])
			}
			if tt.tmp {
				f.Env = append(f.Env, "TMPDIR="+dirs["tmp"])
			}
			conn := filepath.Join(t.TempDir(), "conn.json")
			for _, a := range tt.transport {
				f.Args = append(f.Args, strings.ReplaceAll(a, "CONN", conn))
			}
			if tt.socketDir {
				f.Args = append(f.Args, "--socket-dir="+dirs["dir"])
			}
			k := startRaw(t, f)
			for name, d := range dirs {
				ents, _ := os.ReadDir(d)
				var got []string
				for _, e := range ents {
					got = append(got, e.Name())
				}
				var want []string
				if tt.wantControl == name {
					want = append(want, fmt.Sprintf("kc-%d.sock", k.PID))
				}
				if tt.wantSession == name {
					want = append(want, fmt.Sprintf("kc-%d.python-0.sock", k.PID))
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("%s holds %q, want %q", name, got, want)
				}
			}
			if tt.wantControl == "" {
				if _, _, err := net.SplitHostPort(k.Socket); err != nil {
					t.Errorf("TCP fake reported %q, want host:port", k.Socket)
				}
			}
		})
	}
}

// shortDir is a temporary directory with a short path, so that socket
// names in it keep their usual form.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startRaw starts the fake with exactly f.Args (no --transport or
// --socket-dir added) and the ready knob.
func startRaw(t *testing.T, f Fake) *KCServer {
	t.Helper()
	return StartKCServer(t, "", Fake{Args: f.Args, Env: f.Env, OpenChannels: f.OpenChannels, IdleCheck: f.IdleCheck, raw: true})
}

func TestFakeHashedSessionSocket(t *testing.T) {
	// 82 bytes: kc-<pid>.<8>.sock (17 + pid digits) passes 104 bytes for
	// a pid of 5 digits or more, and the longest hashed name (24) still
	// fits sun_path (107).
	dir := shortDir(t)
	dir = filepath.Join(dir, strings.Repeat("d", 82-len(dir)-1))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k := StartKCServer(t, dir, Fake{OpenChannels: true})
	if k.PID < 10000 {
		t.Skipf("pid %d: the usual session path fits", k.PID)
	}
	ents, _ := os.ReadDir(dir)
	var hashed []string
	for _, e := range ents {
		if n := e.Name(); n != filepath.Base(k.Socket) {
			hashed = append(hashed, n)
		}
	}
	if len(hashed) != 1 {
		t.Fatalf("entries besides the control socket: %q, want one hashed name", hashed)
	}
	hex, ok := strings.CutSuffix(strings.TrimPrefix(hashed[0], "kc-"), ".sock")
	if !ok || len(hex) < 1 || len(hex) > 16 || strings.Trim(hex, "0123456789abcdef") != "" || hex[0] == '0' {
		t.Errorf("hashed name %q: want kc-<1-16 lowercase hex digits, unpadded>.sock", hashed[0])
	}
}

func TestFakeRemovesLeftoverBeforeBinding(t *testing.T) {
	p := filepath.Join(t.TempDir(), "control.sock")
	if err := os.WriteFile(p, []byte("leftover"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := StartKCServer(t, "", Fake{Args: []string{"--unix-socket=" + p}})
	if k.Socket != p {
		t.Fatalf("socket %s, want %s", k.Socket, p)
	}
	if _, err := get(t, p, "/status", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestFakeIdleExitLeavesSockets: --idle-shutdown-hours 0 ends the server
// at an idle check without unlinking anything (std::process::exit).
func TestFakeIdleExitLeavesSockets(t *testing.T) {
	dir := t.TempDir()
	k := StartKCServer(t, dir, Fake{Args: []string{"--idle-shutdown-hours", "0"}, IdleCheck: 100 * time.Millisecond, OpenChannels: true})
	k.Wait(t)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("after the idle exit: %d entries, want both sockets left behind", len(ents))
	}
}

func TestFakeShutdownEndpoint(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	dir := t.TempDir()
	k := StartKCServer(t, dir, Fake{Args: []string{"--token", tok}, OpenChannels: true})
	post := func(auth string) int {
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return net.Dial("unix", k.Socket)
		}}}
		defer c.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost/shutdown", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Fatalf("POST /shutdown without the token: %d, want 401", code)
	}
	if code := post("Bearer s3cret"); code != http.StatusOK {
		t.Fatalf("POST /shutdown with the token: %d", code)
	}
	k.Wait(t)
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("after /shutdown: %d entries left, want none", len(ents))
	}
}

// TestFakeUnderWrapper: with a container ID the fake runs under kc-hook
// supervise, which carries the ID and leads the group.
func TestFakeUnderWrapper(t *testing.T) {
	const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	k := StartKCServer(t, t.TempDir(), Fake{ContainerID: cid, Children: 1})
	kc, err := fingerprint.Read(fingerprint.DefaultRoot, k.PID)
	if err != nil {
		t.Fatal(err)
	}
	w, err := fingerprint.Read(fingerprint.DefaultRoot, k.PGID)
	if err != nil {
		t.Fatal(err)
	}
	if kc.PGID != k.PGID || k.PGID == k.PID {
		t.Errorf("fake %d in group %d, wrapper %d", k.PID, kc.PGID, k.PGID)
	}
	if slices.ContainsFunc(kc.Argv, func(a string) bool { return strings.Contains(a, cid) }) {
		t.Errorf("the fake's argv carries the container ID: %q", kc.Argv)
	}
	if !slices.Contains(w.Argv, cid) {
		t.Errorf("wrapper argv %q lacks the container ID", w.Argv)
	}
}

func TestFakeSessionsFileAndModes(t *testing.T) {
	tests := []struct {
		name    string
		f       Fake
		timeout time.Duration
		wantErr bool
	}{
		{"hang", Fake{Hang: true}, 300 * time.Millisecond, true},
		{"delay shorter than timeout", Fake{Delay: 100 * time.Millisecond}, 5 * time.Second, false},
		{"delay longer than timeout", Fake{Delay: 5 * time.Second}, 200 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := StartKCServer(t, t.TempDir(), tt.f)
			_, err := get(t, k.Socket, "/status", tt.timeout)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
		})
	}

	t.Run("sessions file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "s.json")
		os.WriteFile(f, []byte(`[{"session_id":"aaaaaaaaXX","status":"busy","extra":1},{"session_id":"bbbbbbbbYY","status":"exited"}]`), 0o644)
		k := StartKCServer(t, t.TempDir(), Fake{Sessions: f})
		st, err := get(t, k.Socket, "/status", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if st["sessions"].(float64) != 2 || st["active"].(float64) != 1 || st["busy"] != true {
			t.Errorf("status %v", st)
		}
		ss, err := get(t, k.Socket, "/sessions", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ss["total"].(float64) != 2 || ss["sessions"].([]any)[0].(map[string]any)["extra"].(float64) != 1 {
			t.Errorf("sessions %v", ss)
		}
	})

	t.Run("ignore term", func(t *testing.T) {
		k := StartKCServer(t, t.TempDir(), Fake{IgnoreTerm: true})
		k.Signal(syscall.SIGTERM)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(k.Stderr(), "ignoring") {
			if time.Now().After(deadline) {
				t.Fatal("fake never reported the ignored SIGTERM")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := get(t, k.Socket, "/status", 5*time.Second); err != nil {
			t.Errorf("after ignored SIGTERM: %v", err)
		}
	})
}
