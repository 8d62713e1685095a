package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func waitGone(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for exists(p) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists", p)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFakeServesStatusAndSessions(t *testing.T) {
	dir := t.TempDir()
	const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	k := StartKCServer(t, dir, "--container-id="+cid, "--children=2", "--stubborn-child", "--session-socket")

	id, err := fingerprint.Read(fingerprint.DefaultRoot, k.PID)
	if err != nil {
		t.Fatal(err)
	}
	if id.Comm != "kcserver" {
		t.Errorf("comm %q, want kcserver", id.Comm)
	}
	if id.SID != k.PID || id.PGID != k.PID {
		t.Errorf("sid %d pgid %d, want both %d (session leader)", id.SID, id.PGID, k.PID)
	}
	found := false
	for _, a := range id.Argv {
		if a == "--container-id="+cid {
			found = true
		}
	}
	if !found {
		t.Errorf("argv %q lacks --container-id=<id>", id.Argv)
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
	for _, f := range []string{"sessions", "active", "busy", "idle_seconds", "busy_seconds", "uptime_seconds", "version", "process_id", "started"} {
		if _, ok := st[f]; !ok {
			t.Errorf("status lacks %q: %v", f, st)
		}
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
	sid := ss["sessions"].([]any)[0].(map[string]any)["session_id"].(string)
	sessSock := filepath.Join(dir, fmt.Sprintf("kc-%d.%s.sock", k.PID, sid[:8]))
	if _, err := get(t, sessSock, "/status", 5*time.Second); err != nil {
		t.Errorf("session socket: %v", err)
	}

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
	k := StartKCServer(t, dir, "--session-socket")
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

func TestFakeSessionsFileAndModes(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		timeout time.Duration
		wantErr bool
	}{
		{"hang", []string{"--hang"}, 300 * time.Millisecond, true},
		{"delay shorter than timeout", []string{"--delay=100ms"}, 5 * time.Second, false},
		{"delay longer than timeout", []string{"--delay=5s"}, 200 * time.Millisecond, true},
		{"no setsid", []string{"--setsid=false"}, 5 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := StartKCServer(t, t.TempDir(), tt.args...)
			_, err := get(t, k.Socket, "/status", tt.timeout)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
		})
	}

	t.Run("sessions file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "s.json")
		os.WriteFile(f, []byte(`[{"session_id":"aaaaaaaaXX","status":"busy","extra":1},{"session_id":"bbbbbbbbYY","status":"exited"}]`), 0o644)
		k := StartKCServer(t, t.TempDir(), "--sessions="+f)
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
		k := StartKCServer(t, t.TempDir(), "--ignore-term")
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
