// Command kcserver is a fake Kallichore kernel supervisor for tests. It is
// built by testutil.BuildKCServer as a binary named exactly "kcserver", so
// that its comm is the one kc-watchman's supervisor rules look for.
//
// Its command line is real kcserver's (0.1.64, clap): an unknown flag or a
// stray argument exits 2, and there is no container-ID flag — a container's
// ID is carried by whatever launched it (the `kc-hook supervise` wrapper).
// It does not make itself a session or group leader either: launchers do.
//
//	--port N                      TCP port (default 0: any)
//	--transport tcp|socket|named-pipe
//	                              default socket when --connection-file is
//	                              given, else tcp; named-pipe is refused
//	--socket-dir DIR              where kc-<pid>.sock goes
//	--unix-socket PATH            the control socket's exact path
//	--connection-file F           written once listening (JSON)
//	--idle-shutdown-hours N       absent: never; 0: exit at the first idle
//	                              check that finds it idle (every 30 s)
//	--token F|none, --log-file F, --log-level L,
//	--resource-sample-interval MS accepted; the fake needs no token
//
// Sockets are where the real one puts them: the control socket at
// --unix-socket, else kc-<pid>.sock in --socket-dir, else in
// $XDG_RUNTIME_DIR, else in $TMPDIR (else /tmp). A session's socket is made
// when its channel opens, as kc-<pid>.<first 8 of the session ID>.sock in
// --socket-dir, else in the temp dir (no XDG step, so it can sit elsewhere
// than the control socket), or kc-<u64 hash, lowercase hex>.sock when that
// path would exceed 104 bytes. A leftover file at a path is removed before
// binding. Sockets are unlinked on SIGTERM/SIGINT and POST /shutdown only:
// the idle exit and SIGKILL leave them behind. Session sockets carry the
// kernel's channel stream, not HTTP: they accept and never answer.
//
// GET /status answers the 0.1.64 fields (sessions, active, busy,
// idle_seconds, busy_seconds, uptime_seconds, version, process_id,
// started); GET /sessions answers {total, sessions}. Neither needs a token.
//
// Test knobs are environment variables, since real flags are all taken:
//
//	KCFAKE_READY_FILE=F      once listening, write "<pid>\n<control socket
//	                         path or TCP address>\n" to F (atomically)
//	KCFAKE_SESSIONS=F        JSON list of ActiveSession objects (default:
//	                         one idle, disconnected python session)
//	KCFAKE_OPEN_CHANNELS=1   open every session's channel at start, making
//	                         its socket (socket transport only)
//	KCFAKE_CHILDREN=N        N children "sleep 1000000" in the fake's group
//	KCFAKE_STUBBORN_CHILD=1  one more child that ignores SIGTERM
//	KCFAKE_SETSID_CHILD=1    one more child "sleep 1000000" in a session of
//	                         its own (start_new_session=True): out of the
//	                         fake's group, still its child
//	KCFAKE_DAEMON_CHILD=1    a double-forked "sleep 1000000" in a session of
//	                         its own, orphaned before the fake is ready
//	                         (reparented to a subreaper or PID 1); its pid
//	                         is the ready file's third line
//	KCFAKE_HANG=1            accept, read requests, never answer
//	KCFAKE_DELAY=DUR         answer every request after DUR
//	KCFAKE_COMM=NAME         set its own comm before it is ready
//	KCFAKE_IGNORE_TERM=1     ignore SIGTERM and SIGINT
//	KCFAKE_IDLE_CHECK=DUR    interval of the idle check (default 30s)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxSocketPath is the length beyond which a session socket gets a hashed
// name (the shortest sun_path among Unix flavours Kallichore supports).
const maxSocketPath = 104

const version = "0.1.64"

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		// clap's wording and exit status for a usage error.
		fmt.Fprintf(os.Stderr, "error: %v\n\nUsage: kcserver [OPTIONS]\n\nFor more information, try '--help'.\n", err)
		os.Exit(2)
	}
	if o.help {
		fmt.Println("Usage: kcserver [OPTIONS]")
		return
	}
	if o.version {
		fmt.Println("kcserver " + version)
		return
	}
	k, err := knobsFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kcserver (fake):", err)
		os.Exit(2)
	}
	if err := run(o, k); err != nil {
		fmt.Fprintln(os.Stderr, "kcserver:", err)
		os.Exit(1)
	}
}

// knobs are the fake's test-only settings (KCFAKE_*).
type knobs struct {
	readyFile    string
	sessionsFile string
	openChannels bool
	children     int
	stubborn     bool
	setsidChild  bool
	daemonChild  bool
	hang         bool
	delay        time.Duration
	comm         string
	ignoreTerm   bool
	idleCheck    time.Duration
}

func knobsFromEnv() (knobs, error) {
	k := knobs{
		readyFile:    os.Getenv("KCFAKE_READY_FILE"),
		sessionsFile: os.Getenv("KCFAKE_SESSIONS"),
		openChannels: os.Getenv("KCFAKE_OPEN_CHANNELS") == "1",
		stubborn:     os.Getenv("KCFAKE_STUBBORN_CHILD") == "1",
		setsidChild:  os.Getenv("KCFAKE_SETSID_CHILD") == "1",
		daemonChild:  os.Getenv("KCFAKE_DAEMON_CHILD") == "1",
		hang:         os.Getenv("KCFAKE_HANG") == "1",
		comm:         os.Getenv("KCFAKE_COMM"),
		ignoreTerm:   os.Getenv("KCFAKE_IGNORE_TERM") == "1",
		idleCheck:    30 * time.Second,
	}
	var err error
	if v := os.Getenv("KCFAKE_CHILDREN"); v != "" {
		if k.children, err = strconv.Atoi(v); err != nil {
			return k, fmt.Errorf("KCFAKE_CHILDREN: %w", err)
		}
	}
	if v := os.Getenv("KCFAKE_DELAY"); v != "" {
		if k.delay, err = time.ParseDuration(v); err != nil {
			return k, fmt.Errorf("KCFAKE_DELAY: %w", err)
		}
	}
	if v := os.Getenv("KCFAKE_IDLE_CHECK"); v != "" {
		if k.idleCheck, err = time.ParseDuration(v); err != nil || k.idleCheck <= 0 {
			return k, fmt.Errorf("KCFAKE_IDLE_CHECK: want a positive duration, not %q", v)
		}
	}
	return k, nil
}

// server is the fake's state.
type server struct {
	o        options
	k        knobs
	pid      int
	started  time.Time
	sessions []map[string]any
	token    string

	mu        sync.Mutex
	paths     []string // sockets to unlink on a clean shutdown
	listeners []net.Listener
	hs        *http.Server
	quit      chan struct{} // closed to end the fake cleanly
	quitOnce  sync.Once
	hang      chan struct{} // closed when the fake ends: hung handlers return
}

func run(o options, k knobs) error {
	// Installed before anything else so that a SIGTERM arriving while we
	// start up still takes the clean path. A Go handler (rather than
	// SIG_IGN) keeps the children's dispositions at their defaults.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	sessions, err := loadSessions(k.sessionsFile)
	if err != nil {
		return err
	}
	s := &server{o: o, k: k, pid: os.Getpid(), started: time.Now(), sessions: sessions,
		quit: make(chan struct{}), hang: make(chan struct{})}
	if o.token != "" && o.token != "none" {
		data, err := os.ReadFile(o.token)
		if err != nil {
			return fmt.Errorf("--token: %w", err)
		}
		s.token = strings.TrimSpace(string(data))
	}
	s.hs = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}

	control, where, err := s.listenControl()
	if err != nil {
		s.unlinkAll()
		return err
	}
	if o.transport == "socket" && k.openChannels {
		for _, ss := range sessions {
			if err := s.openChannel(ss); err != nil {
				s.unlinkAll()
				return err
			}
		}
	}
	// Served only now: the sessions are not changed after this.
	go s.hs.Serve(control)
	for i := 0; i < k.children; i++ {
		if err := startChild("sleep", "1000000"); err != nil {
			s.unlinkAll()
			return err
		}
	}
	if k.stubborn {
		if err := startChild("sh", "-c", `trap "" TERM; exec sleep 1000000`); err != nil {
			s.unlinkAll()
			return err
		}
	}
	if k.setsidChild {
		c := exec.Command("sleep", "1000000")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			s.unlinkAll()
			return fmt.Errorf("start setsid child: %w", err)
		}
		go c.Wait()
	}
	daemon := ""
	if k.daemonChild {
		// The shell exits once the daemon runs: the daemon has no parent
		// in the tree by the time the fake is ready, as a real one would.
		out, err := exec.Command("sh", "-c", "setsid sleep 1000000 </dev/null >/dev/null 2>&1 & echo $!").Output()
		if err != nil {
			s.unlinkAll()
			return fmt.Errorf("start daemon child: %w", err)
		}
		daemon = strings.TrimSpace(string(out)) + "\n"
	}
	if k.comm != "" {
		// Through /proc/self/comm, which names the thread-group leader;
		// prctl(PR_SET_NAME) would rename whichever thread runs this.
		if err := os.WriteFile("/proc/self/comm", []byte(k.comm), 0); err != nil {
			return fmt.Errorf("KCFAKE_COMM: %w", err)
		}
	}
	if o.connectionFile != "" {
		if err := writeAtomic(o.connectionFile, s.connectionInfo(where)); err != nil {
			s.unlinkAll()
			return err
		}
	}
	if k.readyFile != "" {
		if err := writeAtomic(k.readyFile, strconv.Itoa(s.pid)+"\n"+where+"\n"+daemon); err != nil {
			s.unlinkAll()
			return err
		}
	}
	if o.idleHours >= 0 {
		go s.idleWatch()
	}

wait:
	for {
		select {
		case sig := <-sigs:
			if k.ignoreTerm {
				fmt.Fprintf(os.Stderr, "kcserver: ignoring %v\n", sig)
				continue
			}
		case <-s.quit:
		}
		break wait
	}
	close(s.hang)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s.hs.Shutdown(ctx)
	s.unlinkAll()
	return nil
}

// controlPath is where the control socket goes: --unix-socket, else
// kc-<pid>.sock in --socket-dir, $XDG_RUNTIME_DIR or the temp dir.
func (s *server) controlPath() string {
	if s.o.unixSocket != "" {
		return s.o.unixSocket
	}
	dir := s.o.socketDir
	if dir == "" {
		dir = os.Getenv("XDG_RUNTIME_DIR")
	}
	if dir == "" {
		dir = os.TempDir()
	}
	return filepath.Join(dir, fmt.Sprintf("kc-%d.sock", s.pid))
}

// sessionPath is where a session's socket goes: --socket-dir, else the
// temp dir (no XDG step); hashed when the usual path is too long.
func (s *server) sessionPath(id string) string {
	dir := s.o.socketDir
	if dir == "" {
		dir = os.TempDir()
	}
	tag := id
	if len(tag) > 8 {
		tag = tag[:8]
	}
	p := filepath.Join(dir, fmt.Sprintf("kc-%d.%s.sock", s.pid, tag))
	if len(p) <= maxSocketPath {
		return p
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", s.pid, id)
	return filepath.Join(dir, fmt.Sprintf("kc-%x.sock", h.Sum64()))
}

// listenControl binds the control listener and says where it is (a
// socket path or a TCP address).
func (s *server) listenControl() (net.Listener, string, error) {
	switch s.o.transport {
	case "tcp":
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.o.port)))
		if err != nil {
			return nil, "", err
		}
		s.listeners = append(s.listeners, l)
		return l, l.Addr().String(), nil
	case "socket":
		p := s.controlPath()
		l, err := s.bind(p)
		return l, p, err
	}
	return nil, "", fmt.Errorf("transport %s is not supported on this platform", s.o.transport)
}

// bind removes a leftover at p, as Kallichore does, and listens there.
func (s *server) bind(p string) (net.Listener, error) {
	os.Remove(p)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// Unlinking is ours to do, and only on a clean shutdown.
	l.SetUnlinkOnClose(false)
	s.mu.Lock()
	s.paths = append(s.paths, p)
	s.listeners = append(s.listeners, l)
	s.mu.Unlock()
	return l, nil
}

// openChannel makes a session's socket and records it as socket_path.
func (s *server) openChannel(ss map[string]any) error {
	id, _ := ss["session_id"].(string)
	if id == "" {
		return nil
	}
	p := s.sessionPath(id)
	l, err := s.bind(p)
	if err != nil {
		return fmt.Errorf("session %s: %w", id, err)
	}
	ss["socket_path"] = p
	go s.serveChannel(l)
	return nil
}

// serveChannel accepts connections and reads what clients send; the
// kernel's channel stream is not HTTP, so nothing is ever answered.
func (s *server) serveChannel(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
	}
}

func (s *server) unlinkAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		l.Close()
	}
	for _, p := range s.paths {
		os.Remove(p)
	}
}

func (s *server) connectionInfo(where string) string {
	info := map[string]any{"transport": s.o.transport, "server_pid": s.pid, "log_path": s.o.logFile}
	if s.o.transport == "tcp" {
		_, port, _ := net.SplitHostPort(where)
		n, _ := strconv.Atoi(port)
		info["port"], info["base_path"] = n, "http://"+where
	} else {
		info["socket_path"] = where
	}
	if s.token != "" {
		info["bearer_token"] = s.token
	}
	data, _ := json.Marshal(info)
	return string(data) + "\n"
}

// idleWatch exits the process (leaving every socket behind, as
// std::process::exit does) once the server has been idle for
// --idle-shutdown-hours at a check; 0 hours means the first idle check.
func (s *server) idleWatch() {
	limit := time.Duration(s.o.idleHours) * time.Hour
	var idleSince time.Time
	t := time.NewTicker(s.k.idleCheck)
	defer t.Stop()
	for range t.C {
		if !s.idle() {
			idleSince = time.Time{}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if time.Since(idleSince) >= limit {
			fmt.Fprintln(os.Stderr, "kcserver: idle; exiting")
			os.Exit(0)
		}
	}
}

// idle is Kallichore's rule: no session busy and none connected.
func (s *server) idle() bool {
	for _, ss := range s.sessions {
		if st, _ := ss["status"].(string); st == "busy" {
			return false
		}
		if c, _ := ss["connected"].(bool); c {
			return false
		}
	}
	return true
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

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.k.hang {
		// Never answer. Hold the connection until the fake exits (or the
		// client gives up).
		select {
		case <-s.hang:
		case <-r.Context().Done():
		}
		return
	}
	if s.k.delay > 0 {
		select {
		case <-time.After(s.k.delay):
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/status":
		writeJSON(w, s.status())
	case r.Method == http.MethodGet && r.URL.Path == "/sessions":
		writeJSON(w, map[string]any{"total": len(s.sessions), "sessions": s.sessions})
	case r.Method == http.MethodPost && r.URL.Path == "/shutdown":
		if s.token != "" && r.Header.Get("Authorization") != "Bearer "+s.token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		writeJSON(w, map[string]any{})
		s.quitOnce.Do(func() { close(s.quit) })
	case r.URL.Path == "/status" || r.URL.Path == "/sessions" || r.URL.Path == "/shutdown":
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	default:
		http.NotFound(w, r)
	}
}

func (s *server) status() map[string]any {
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
		"version":        version,
		"process_id":     s.pid,
		"started":        s.started.UTC().Format(time.RFC3339Nano),
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
