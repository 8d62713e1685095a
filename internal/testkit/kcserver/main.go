// Command kcserver is a fake Kallichore kernel supervisor for tests. It is
// built by testkit.BuildKCServer as a binary named exactly "kcserver", so
// that its comm is the one kc-watchman's supervisor rules look for.
//
// It serves GET /status (ServerStatus) and GET /sessions
// ({"total": n, "sessions": [...]}) as HTTP/1.1 on Unix sockets, the way
// Kallichore does, spawns children into its own process group, and leaves
// exactly the corpses a real supervisor leaves: on SIGTERM/SIGINT it
// unlinks its sockets and exits; on SIGKILL the sockets stay behind; its
// children are never killed by it (they become real orphans).
//
// Flags (single or double dash; "--flag=value" or "--flag value"):
//
//	--socket-dir DIR     listen on DIR/kc-<own pid>.sock (default: the temp dir)
//	--container-id ID    accepted and ignored; present so that the ID is in
//	                     argv. Pass it as "--container-id=<ID>" to get the
//	                     "=<id>" form, or as two elements for the bare form.
//	--children N         start N children running "sleep 1000000" in the
//	                     fake's process group; they carry no container ID
//	--stubborn-child     start one extra child that ignores SIGTERM:
//	                     sh -c 'trap "" TERM; exec sleep 1000000' (an ignored signal stays ignored across exec)
//	--sessions FILE      JSON list of ActiveSession objects served by
//	                     /sessions (default: one idle, disconnected session)
//	--session-socket     also listen on DIR/kc-<pid>.<first 8 chars of the
//	                     session id>.sock for every session
//	--hang               accept connections and read requests, never answer
//	--delay DUR          answer every request after DUR (e.g. 500ms)
//	--comm NAME          set its own comm (via /proc/self/comm) before it is
//	                     ready, so a test can give its trees a supervisor
//	                     name no other test's janitor run will match
//	--ready-file F       written (atomically) once every socket listens;
//	                     contains the fake's pid and a newline
//	--setsid             become a session (and process group) leader, like a
//	                     real supervisor (default true; --setsid=false keeps
//	                     the parent's session and group)
//	--ignore-term        ignore SIGTERM and SIGINT (only SIGKILL ends it)
//
// /status reports sessions (count), active (sessions whose status is not
// "exited"), busy (any session "busy"), idle_seconds, busy_seconds,
// uptime_seconds, version, process_id (the fake's own pid), started and
// server_id. Other paths answer 404.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type options struct {
	socketDir     string
	containerID   string
	children      int
	stubborn      bool
	sessionsFile  string
	sessionSocket bool
	hang          bool
	delay         time.Duration
	readyFile     string
	comm          string
	setsid        bool
	ignoreTerm    bool
}

func main() {
	var o options
	fs := flag.NewFlagSet("kcserver", flag.ContinueOnError)
	fs.StringVar(&o.socketDir, "socket-dir", os.TempDir(), "directory for kc-<pid>.sock")
	fs.StringVar(&o.containerID, "container-id", "", "container ID (only carried in argv)")
	fs.IntVar(&o.children, "children", 0, "number of `sleep 1000000` children in the process group")
	fs.BoolVar(&o.stubborn, "stubborn-child", false, "start one extra child that ignores SIGTERM")
	fs.StringVar(&o.sessionsFile, "sessions", "", "JSON `FILE` with a list of ActiveSession objects")
	fs.BoolVar(&o.sessionSocket, "session-socket", false, "also listen on kc-<pid>.<session id[:8]>.sock")
	fs.BoolVar(&o.hang, "hang", false, "accept, never answer")
	fs.DurationVar(&o.delay, "delay", 0, "answer after `DUR`")
	fs.StringVar(&o.comm, "comm", "", "set own comm to `NAME` (at most 15 bytes)")
	fs.StringVar(&o.readyFile, "ready-file", "", "write the pid to `FILE` once listening")
	fs.BoolVar(&o.setsid, "setsid", true, "become a session leader")
	fs.BoolVar(&o.ignoreTerm, "ignore-term", false, "ignore SIGTERM and SIGINT")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "kcserver:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	// Install the handler before anything else so that a SIGTERM arriving
	// while we start up still takes the clean path. A Go handler (rather
	// than SIG_IGN) keeps the children's dispositions at their defaults.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	if o.setsid {
		if _, err := syscall.Setsid(); err != nil && !isSessionLeader() {
			return fmt.Errorf("setsid: %w (already a process group leader?)", err)
		}
	}

	sessions, err := loadSessions(o.sessionsFile)
	if err != nil {
		return err
	}
	pid := os.Getpid()

	srv := &server{opts: o, pid: pid, started: time.Now(), sessions: sessions, hang: make(chan struct{})}
	paths := []string{filepath.Join(o.socketDir, fmt.Sprintf("kc-%d.sock", pid))}
	if o.sessionSocket {
		for _, s := range sessions {
			id, _ := s["session_id"].(string)
			if len(id) > 8 {
				id = id[:8]
			}
			if id == "" {
				continue
			}
			p := filepath.Join(o.socketDir, fmt.Sprintf("kc-%d.%s.sock", pid, id))
			if _, ok := s["socket_path"]; !ok {
				s["socket_path"] = p
			}
			paths = append(paths, p)
		}
	}
	var listeners []*net.UnixListener
	unlinkAll := func() {
		for _, l := range listeners {
			l.Close() // unlinks the path: Listen set UnlinkOnClose
		}
		for _, p := range paths {
			os.Remove(p)
		}
	}
	for _, p := range paths {
		// Kallichore removes a leftover file at its path before binding.
		os.Remove(p)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			unlinkAll()
			return err
		}
		listeners = append(listeners, l)
	}

	for i := 0; i < o.children; i++ {
		if err := startChild("sleep", "1000000"); err != nil {
			unlinkAll()
			return err
		}
	}
	if o.stubborn {
		if err := startChild("sh", "-c", `trap "" TERM; exec sleep 1000000`); err != nil {
			unlinkAll()
			return err
		}
	}

	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	for _, l := range listeners {
		go hs.Serve(l)
	}
	if o.comm != "" {
		// Through /proc/self/comm, which names the thread-group leader;
		// prctl(PR_SET_NAME) would rename whichever thread runs this.
		if err := os.WriteFile("/proc/self/comm", []byte(o.comm), 0); err != nil {
			return fmt.Errorf("--comm: %w", err)
		}
	}
	if o.readyFile != "" {
		if err := writeAtomic(o.readyFile, strconv.Itoa(pid)+"\n"); err != nil {
			unlinkAll()
			return err
		}
	}

	for sig := range sigs {
		if o.ignoreTerm {
			fmt.Fprintf(os.Stderr, "kcserver: ignoring %v\n", sig)
			continue
		}
		break
	}
	close(srv.hang)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	hs.Shutdown(ctx)
	unlinkAll()
	return nil
}

// startChild starts a child in the fake's process group with stdio on
// /dev/null (so it never holds a test's pipes open) and reaps it if it
// exits while the fake lives. Nothing kills it when the fake exits.
func startChild(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start child %s: %w", name, err)
	}
	go cmd.Wait()
	return nil
}

func loadSessions(file string) ([]map[string]any, error) {
	if file == "" {
		return []map[string]any{defaultSession()}, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: want a JSON list of objects: %w", file, err)
	}
	if out == nil {
		out = []map[string]any{} // "null": serve an empty list, as Kallichore would
	}
	return out, nil
}

func defaultSession() map[string]any {
	return map[string]any{
		"session_id":          "python-0a1b2c3d4e5f",
		"argv":                []string{"python3", "-m", "ipykernel", "-f", "{connection_file}"},
		"username":            "user",
		"display_name":        "Python 3.11",
		"language":            "python",
		"interrupt_mode":      "message",
		"connected":           false,
		"started":             time.Now().UTC().Format(time.RFC3339),
		"session_mode":        "console",
		"working_directory":   "/home/user",
		"input_prompt":        ">>> ",
		"continuation_prompt": "... ",
		"execution_queue":     map[string]any{"length": 0, "pending": []any{}},
		"status":              "idle",
		"kernel_info":         map[string]any{},
		"idle_seconds":        90000,
		"busy_seconds":        0,
		"resource_usage": map[string]any{
			"cpu_percent": 0, "memory_bytes": 104857600, "thread_count": 4,
			"sampling_period_ms": 1000, "timestamp": time.Now().UnixMilli(),
		},
	}
}

type server struct {
	opts     options
	pid      int
	started  time.Time
	sessions []map[string]any
	hang     chan struct{}
	once     sync.Once
	serverID string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.hang {
		// Never answer. Hold the connection until the fake exits (or the
		// client gives up).
		select {
		case <-s.hang:
		case <-r.Context().Done():
		}
		return
	}
	if s.opts.delay > 0 {
		select {
		case <-time.After(s.opts.delay):
		case <-r.Context().Done():
			return
		}
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/status":
		writeJSON(w, s.status())
	case "/sessions":
		writeJSON(w, map[string]any{"total": len(s.sessions), "sessions": s.sessions})
	default:
		http.NotFound(w, r)
	}
}

func (s *server) status() map[string]any {
	s.once.Do(func() {
		var b [16]byte
		f, err := os.Open("/dev/urandom")
		if err == nil {
			f.Read(b[:])
			f.Close()
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		s.serverID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	})
	active, busy := 0, false
	for _, ss := range s.sessions {
		st, _ := ss["status"].(string)
		if st != "exited" {
			active++
		}
		if st == "busy" {
			busy = true
		}
	}
	up := int64(time.Since(s.started).Seconds())
	idle, busySec := up, int64(0)
	if busy {
		idle, busySec = 0, up
	}
	return map[string]any{
		"sessions":       len(s.sessions),
		"active":         active,
		"busy":           busy,
		"idle_seconds":   idle,
		"busy_seconds":   busySec,
		"uptime_seconds": up,
		"version":        "0.0.0-fake",
		"process_id":     s.pid,
		"started":        s.started.UTC().Format(time.RFC3339Nano),
		"server_id":      s.serverID,
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

func writeAtomic(path, content string) error {
	tmp := path + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func isSessionLeader() bool {
	sid, err := unix.Getsid(0)
	return err == nil && sid == os.Getpid()
}
