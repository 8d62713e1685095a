package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func writeSessions(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sessions.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const cullSessions = `[
 {"session_id":"py-old","language":"python","status":"idle","connected":false,"idle_seconds":90000,
  "working_directory":"/home/a","resource_usage":{"memory_bytes":1000}},
 {"session_id":"py-edge","language":"python","status":"idle","connected":false,"idle_seconds":3600,
  "resource_usage":{"memory_bytes":200}},
 {"session_id":"r-conn","language":"r","status":"idle","connected":true,"idle_seconds":999999,
  "resource_usage":{"memory_bytes":30}}
]`

type cullOut struct {
	Threshold   int64 `json:"threshold_seconds"`
	Supervisors []struct {
		Socket     string  `json:"socket"`
		PID        int     `json:"pid"`
		Total      int     `json:"sessions_total"`
		Memory     int64   `json:"memory_bytes"`
		Error      *string `json:"error"`
		Candidates []struct {
			ID string `json:"session_id"`
		} `json:"candidates"`
	} `json:"supervisors"`
}

func checkCullKeys(t *testing.T, out string) {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if got := sortedKeys(raw); !reflect.DeepEqual(got, []string{"supervisors", "threshold_seconds"}) {
		t.Errorf("keys %v", got)
	}
	for _, s := range raw["supervisors"].([]any) {
		m := s.(map[string]any)
		if got := sortedKeys(m); !reflect.DeepEqual(got, []string{"candidates", "error", "memory_bytes", "pid", "sessions_total", "socket"}) {
			t.Errorf("supervisor keys %v", got)
		}
		if _, ok := m["candidates"].([]any); !ok {
			t.Errorf("candidates is %v, want a list", m["candidates"])
		}
		for _, c := range m["candidates"].([]any) {
			want := []string{"connected", "idle_seconds", "language", "memory_bytes", "session_id", "status", "working_directory"}
			if got := sortedKeys(c.(map[string]any)); !reflect.DeepEqual(got, want) {
				t.Errorf("candidate keys %v", got)
			}
		}
	}
}

func TestCullCLI(t *testing.T) {
	dir := t.TempDir()
	k := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: writeSessions(t, cullSessions), OpenChannels: true})
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantThresh int64
		wantCands  []string
	}{
		{"default 24h", nil, nil, 86400, []string{"py-old"}},
		{"--idle duration", []string{"--idle", "30m"}, nil, 1800, []string{"py-old", "py-edge"}},
		{"--idle seconds", []string{"--idle", "3600"}, nil, 3600, []string{"py-old"}},
		{"KC_IDLE_SECONDS", nil, map[string]string{"KC_IDLE_SECONDS": "3599"}, 3599, []string{"py-old", "py-edge"}},
		{"flag beats env", []string{"--idle", "100000"}, map[string]string{"KC_IDLE_SECONDS": "1"}, 100000, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for key, v := range tt.env {
				t.Setenv(key, v)
			}
			args := append([]string{"cull", "--format", "json", "--socket-dir", dir}, tt.args...)
			code, out := runJanitorCapture(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d\n%s", code, out)
			}
			checkCullKeys(t, out)
			var got cullOut
			json.Unmarshal([]byte(out), &got)
			if got.Threshold != tt.wantThresh {
				t.Errorf("threshold %d, want %d", got.Threshold, tt.wantThresh)
			}
			if len(got.Supervisors) != 1 {
				t.Fatalf("supervisors: %s", out)
			}
			s := got.Supervisors[0]
			if s.Socket != k.Socket || s.PID != k.PID || s.Total != 3 || s.Memory != 1230 || s.Error != nil {
				t.Errorf("supervisor %+v", s)
			}
			var ids []string
			for _, c := range s.Candidates {
				ids = append(ids, c.ID)
			}
			if !reflect.DeepEqual(ids, tt.wantCands) {
				t.Errorf("candidates %v, want %v", ids, tt.wantCands)
			}
		})
	}
}

func TestCullCLIUnreadableSupervisor(t *testing.T) {
	dir := t.TempDir()
	good := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: writeSessions(t, cullSessions)})
	dead := orphanSock(t, t.TempDir(), goneSockName(t))
	hung := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Hang: true})
	code, out := runJanitorCapture(t, "cull", "--format", "json", "--timeout", "300ms",
		"--socket", dead, "--socket", good.Socket, "--socket", hung.Socket)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	checkCullKeys(t, out)
	var got cullOut
	json.Unmarshal([]byte(out), &got)
	if len(got.Supervisors) != 3 {
		t.Fatalf("%s", out)
	}
	if s := got.Supervisors[0]; s.Error == nil || s.Socket != dead {
		t.Errorf("dead: %+v", s)
	}
	if s := got.Supervisors[1]; s.Error != nil || len(s.Candidates) != 1 || s.Memory != 1230 {
		t.Errorf("good: %+v", s)
	}
	if s := got.Supervisors[2]; s.Error == nil {
		t.Errorf("hung: %+v", s)
	}
}

// TestCullCLIHungSupervisorIsReported: a supervisor found in a socket
// directory that listens but never answers /status is left unknown by the
// sweep; cull still asks it and reports it unreadable (exit 1): dropped, it
// vanished from the report of a run that exited 0.
func TestCullCLIHungSupervisorIsReported(t *testing.T) {
	dir := t.TempDir()
	hung := testutil.StartKCServer(t, dir, testutil.Fake{Hang: true})
	code, out := runJanitorCapture(t, "cull", "--socket-dir", dir, "--format", "json", "--timeout", "300ms")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	var got cullOut
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Supervisors) != 1 {
		t.Fatalf("%s (%v)", out, err)
	}
	if s := got.Supervisors[0]; s.Socket != hung.Socket || s.Error == nil {
		t.Errorf("hung supervisor: %+v, want it reported with an error", s)
	}
}

func TestCullCLIText(t *testing.T) {
	dir := t.TempDir()
	testutil.StartKCServer(t, dir, testutil.Fake{Sessions: writeSessions(t, cullSessions)})
	logFile := filepath.Join(t.TempDir(), "culler.log")
	t.Setenv("KC_CULLER_LOG", logFile)
	code, out := runJanitorCapture(t, "cull", "--socket-dir", dir)
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"SESSION", "LANGUAGE", "py-old", "python", "1d1h", "1000 B", "/home/a", "nothing was shut down"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "r-conn") || strings.Contains(out, "py-edge") {
		t.Errorf("non-candidates listed:\n%s", out)
	}
	if data, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(data), "py-old") {
		t.Errorf("KC_CULLER_LOG: %v %q", err, data)
	}
}

func TestCullCLIUsage(t *testing.T) {
	for _, args := range [][]string{
		{"cull", "--idle", "soon"},
		{"cull", "--idle", "-5"},
		{"cull", "--format", "yaml"},
		{"cull", "--socket", "kc-1.sock"}, // relative: cron's working directory is not the operator's
		// A named host socket would widen a run scoped to a container.
		{"cull", "--socket", "/tmp/kc-1.sock", "--container", "web"},
		{"cull", "--socket", "/tmp/kc-1.sock", "--container-pid", strconv.Itoa(os.Getpid())},
		// Two containers named: which one's sockets would be a guess.
		{"sweep", "--container", "web", "--container-pid", strconv.Itoa(os.Getpid())},
		{"cull", "--container", "web", "--container-pid", strconv.Itoa(os.Getpid())},
	} {
		if code, out := runJanitorCapture(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, code, exitUsage, out)
		}
	}
	t.Run("a leftover KC_CONTAINER_PID", func(t *testing.T) {
		t.Setenv("KC_CONTAINER_PID", strconv.Itoa(os.Getpid()))
		if code, out := runJanitorCapture(t, "sweep", "--container", "web"); code != exitUsage {
			t.Errorf("exit %d, want %d\n%s", code, exitUsage, out)
		}
	})
	t.Setenv("KC_IDLE_SECONDS", "lots")
	if code, _ := runJanitorCapture(t, "cull", "--socket-dir", t.TempDir()); code != exitUsage {
		t.Errorf("bad KC_IDLE_SECONDS: exit %d", code)
	}
}

// TestCullNamedNonSocket: a --socket that is no socket is reported as
// such (not as a refused connection after a retry), and fails the run:
// a symlink is not followed, and a path under another user's unserved
// FUSE mount is not looked up (that would wait for ever).
func TestCullNamedNonSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kc-123.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	live := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
	link := filepath.Join(dir, "kc-124.sock")
	if err := os.Symlink(live.Socket, link); err != nil {
		t.Fatal(err)
	}
	fuse := testutil.MountFUSE(t, dir, "fuse", "allow_other,default_permissions")
	// Through a symlink: no path the mount table shows, so the walk must
	// judge the mount itself.
	fuseLink := filepath.Join(t.TempDir(), "ln")
	if err := os.Symlink(fuse, fuseLink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{file, "is not a socket (regular file)"},
		{dir, "is not a socket (directory)"},
		{filepath.Join(dir, "missing.sock"), "no such file or directory"},
		{link, "is not a socket (symlink)"},
		{filepath.Join(fuse, "sub", "kc-125.sock"), "on a user's FUSE mount"},
		{filepath.Join(fuseLink, "sub", "kc-125.sock"), "on a user's FUSE mount"},
	} {
		type ran struct {
			code int
			out  string
		}
		r := testutil.Within(t, 20*time.Second, "cull", func() ran {
			code, out := runJanitorCapture(t, "cull", "--socket", tc.path)
			return ran{code, out}
		})
		code, out := r.code, r.out
		if code != exitFailed || !strings.Contains(out, tc.path) || !strings.Contains(out, tc.want) || strings.Contains(out, "connect:") {
			t.Errorf("cull --socket %s: exit %d, want %d and %q:\n%s", tc.path, code, exitFailed, tc.want, out)
		}
	}
	// Reported in the order given, around the supervisor that is read.
	good := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{Sessions: writeSessions(t, cullSessions)})
	code, out := runJanitorCapture(t, "cull", "--format", "json", "--socket", file, "--socket", good.Socket, "--socket", dir)
	var got cullOut
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitFailed {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	var order []string
	for _, sup := range got.Supervisors {
		order = append(order, sup.Socket)
	}
	if want := []string{file, good.Socket, dir}; !reflect.DeepEqual(order, want) {
		t.Errorf("supervisors %q, want %q", order, want)
	}
}

func TestCullCLINoSupervisors(t *testing.T) {
	code, out := runJanitorCapture(t, "cull", "--format", "json", "--socket-dir", t.TempDir())
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	checkCullKeys(t, out)
	if !strings.Contains(out, `"supervisors": []`) {
		t.Errorf("%s", out)
	}
}

// TestCullCLIUnreadableSocketDir: a socket directory that cannot be read
// hides its supervisors: cull exits 1, as sweep does, quiet or not.
func TestCullCLIUnreadableSocketDir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	for _, args := range [][]string{{"cull", "--socket-dir", missing}, {"-q", "cull", "--socket-dir", missing}, {"sweep", "--socket-dir", missing}} {
		if code, out := runJanitorCapture(t, args...); code != exitFailed {
			t.Errorf("%v: exit %d, want %d\n%s", args, code, exitFailed, out)
		}
	}
}

// TestSlowSupervisorIsLive: a kcserver that takes 2 s to answer is live
// with the default timeouts (the seed's: 3 s connect, 5 s, a retry after
// 2 s): sweep calls it live and keeps it, cull reads it and exits 0.
func TestSlowSupervisorIsLive(t *testing.T) {
	dir := t.TempDir()
	k := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: writeSessions(t, cullSessions), Delay: 2 * time.Second})

	code, out := runJanitorCapture(t, "sweep", "--socket-dir", dir, "--format", "json")
	if code != exitOK {
		t.Fatalf("sweep exit %d\n%s", code, out)
	}
	var sw struct {
		Sockets []struct{ Path, Verdict, Reason string }
	}
	if err := json.Unmarshal([]byte(out), &sw); err != nil || len(sw.Sockets) != 1 {
		t.Fatalf("sweep printed %s (%v)", out, err)
	}
	if s := sw.Sockets[0]; s.Path != k.Socket || s.Verdict != "live" {
		t.Errorf("slow supervisor: %+v, want live", s)
	}

	code, out = runJanitorCapture(t, "cull", "--socket-dir", dir, "--format", "json")
	if code != exitOK {
		t.Fatalf("cull exit %d, want 0\n%s", code, out)
	}
	var got cullOut
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Supervisors) != 1 || got.Supervisors[0].Error != nil {
		t.Errorf("cull: %s (%v)", out, err)
	}
}

// TestCullCLIUnprobedSupervisorIsReported: a live supervisor whose socket
// the sweep's deadline left unprobed is reported not audited (exit 1):
// left out, it vanished from the report of a run that exited 0.
func TestCullCLIUnprobedSupervisorIsReported(t *testing.T) {
	dir := t.TempDir()
	k := testutil.StartKCServer(t, dir, testutil.Fake{Sessions: writeSessions(t, cullSessions)})
	code, out := runJanitorCapture(t, "cull", "--socket-dir", dir, "--format", "json", "--sweep-deadline", "1ns")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	checkCullKeys(t, out)
	var got cullOut
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Supervisors) != 1 {
		t.Fatalf("%s (%v)", out, err)
	}
	if s := got.Supervisors[0]; s.Socket != k.Socket || s.Error == nil || !strings.Contains(*s.Error, "not audited") {
		t.Errorf("unprobed supervisor: %+v, want it reported not audited", s)
	}
}
