package kallichore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

const statusOK = `{"sessions":2,"active":1,"busy":false,"idle_seconds":12,"busy_seconds":3,
"uptime_seconds":99,"version":"0.1.64","process_id":4242,"started":"2025-01-02T03:04:05Z",
"server_id":"c0ffee00-0000-4000-8000-000000000000","future_field":{"x":[1,2]}}`

const sessionObj = `{"session_id":"python-1234abcd","argv":["python3"],"username":"u",
"display_name":"Python","language":"python","interrupt_mode":"message","connected":false,
"started":"2025-01-02T03:04:05Z","session_mode":"console","working_directory":"/w",
"input_prompt":">>> ","continuation_prompt":"... ","execution_queue":{"length":0,"pending":[]},
"status":"idle","kernel_info":{"banner":"hi"},"idle_seconds":90000,"busy_seconds":1,
"process_id":77,"resource_usage":{"cpu_percent":1,"memory_bytes":1048576,"thread_count":3,
"sampling_period_ms":1000,"timestamp":1700000000000},"brand_new":true}`

func TestDecodeStatus(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantPID int
		wantErr error
	}{
		{"full with unknown fields", statusOK, 4242, nil},
		{"only process_id", `{"process_id":7}`, 7, nil},
		{"whitespace around", "\n " + `{"process_id":7}` + "\n", 7, nil},
		{"no process_id", `{"sessions":1,"version":"x"}`, 0, ErrShape},
		{"process_id null", `{"process_id":null}`, 0, ErrShape},
		{"process_id string", `{"process_id":"7"}`, 0, ErrShape},
		{"process_id fractional", `{"process_id":7.5}`, 0, ErrShape},
		{"busy not bool", `{"process_id":7,"busy":"no"}`, 0, ErrShape},
		{"list", `[{"process_id":7}]`, 0, ErrShape},
		{"string", `"ok"`, 0, ErrShape},
		{"null", `null`, 0, ErrShape},
		{"empty", ``, 0, ErrBadJSON},
		{"truncated", `{"process_id":7`, 0, ErrBadJSON},
		{"html", `<html>502</html>`, 0, ErrBadJSON},
		{"trailing garbage", `{"process_id":7} x`, 0, ErrBadJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := DecodeStatus([]byte(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.ProcessID != tt.wantPID {
				t.Errorf("process_id %d, want %d", st.ProcessID, tt.wantPID)
			}
		})
	}
	st, _ := DecodeStatus([]byte(statusOK))
	want := ServerStatus{Sessions: 2, Active: 1, IdleSeconds: 12, BusySeconds: 3, UptimeSeconds: 99,
		Version: "0.1.64", ProcessID: 4242, Started: "2025-01-02T03:04:05Z", ServerID: "c0ffee00-0000-4000-8000-000000000000"}
	if st != want {
		t.Errorf("got %+v\nwant %+v", st, want)
	}
}

func TestDecodeSessions(t *testing.T) {
	minimal := `{"session_id":"s1","status":"busy","connected":true,"idle_seconds":0}`
	many := func(n int) string { return "[" + strings.Repeat(minimal+",", n-1) + minimal + "]" }
	tests := []struct {
		name      string
		in        string
		wantTotal int
		wantN     int
		wantErr   error
	}{
		{"documented object", `{"total":1,"sessions":[` + sessionObj + `]}`, 1, 1, nil},
		{"as many sessions as an answer may list", many(maxSessions), maxSessions, maxSessions, nil},
		{"one session more", many(maxSessions + 1), 0, 0, ErrShape},
		{"sessions given twice", `{"sessions":[` + minimal + `],"sessions":[` + minimal + `,` + minimal + `]}`, 2, 2, nil},
		{"older bare list", `[` + sessionObj + `,` + minimal + `]`, 2, 2, nil},
		{"empty object list", `{"total":0,"sessions":[]}`, 0, 0, nil},
		{"empty bare list", `[]`, 0, 0, nil},
		{"total missing", `{"sessions":[` + minimal + `]}`, 1, 1, nil},
		{"total differs from list", `{"total":5,"sessions":[` + minimal + `]}`, 5, 1, nil},
		{"extra top-level fields", `{"total":1,"sessions":[` + minimal + `],"next":null}`, 1, 1, nil},
		{"fractional memory", `[{"session_id":"s","status":"idle","connected":false,"idle_seconds":1,"resource_usage":{"memory_bytes":10.9,"cpu_percent":0.5}}]`, 1, 1, nil},
		{"null resource usage", `[{"session_id":"s","status":"idle","connected":false,"idle_seconds":1,"resource_usage":null}]`, 1, 1, nil},
		{"sessions null", `{"total":0,"sessions":null}`, 0, 0, ErrShape},
		{"sessions missing", `{"total":0}`, 0, 0, ErrShape},
		{"sessions not a list", `{"total":1,"sessions":{"a":1}}`, 0, 0, ErrShape},
		{"total not int", `{"total":"1","sessions":[]}`, 0, 0, ErrShape},
		{"element not object", `[1]`, 0, 0, ErrShape},
		{"element null", `[null]`, 0, 0, ErrShape},
		{"no session_id", `[{"status":"idle","connected":false,"idle_seconds":1}]`, 0, 0, ErrShape},
		{"empty session_id", `[{"session_id":"","status":"idle","connected":false,"idle_seconds":1}]`, 0, 0, ErrShape},
		{"no connected", `[{"session_id":"s","status":"idle","idle_seconds":1}]`, 0, 0, ErrShape},
		{"no status", `[{"session_id":"s","connected":false,"idle_seconds":1}]`, 0, 0, ErrShape},
		{"no idle_seconds", `[{"session_id":"s","status":"idle","connected":false}]`, 0, 0, ErrShape},
		{"connected as string", `[{"session_id":"s","status":"idle","connected":"false","idle_seconds":1}]`, 0, 0, ErrShape},
		{"memory as string", `[{"session_id":"s","status":"idle","connected":false,"idle_seconds":1,"resource_usage":{"memory_bytes":"1"}}]`, 0, 0, ErrShape},
		{"number", `42`, 0, 0, ErrShape},
		{"bad json", `{"total":1,"sessions":[`, 0, 0, ErrBadJSON},
		{"empty", ``, 0, 0, ErrBadJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := DecodeSessions([]byte(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.Total != tt.wantTotal || len(l.Sessions) != tt.wantN {
				t.Errorf("total %d, %d sessions; want %d, %d", l.Total, len(l.Sessions), tt.wantTotal, tt.wantN)
			}
		})
	}

	l, err := DecodeSessions([]byte(`[` + sessionObj + `]`))
	if err != nil {
		t.Fatal(err)
	}
	s := l.Sessions[0]
	if s.SessionID != "python-1234abcd" || s.Language != "python" || s.Connected || s.Status != "idle" ||
		s.IdleSeconds != 90000 || s.MemoryBytes() != 1048576 || s.WorkingDirectory != "/w" || s.ProcessID != 77 {
		t.Errorf("decoded %+v", s)
	}
	if string(s.KernelInfo) != `{"banner":"hi"}` {
		t.Errorf("kernel_info %s", s.KernelInfo)
	}
}

// TestMemoryFiguresCannotCancelOut: a made-up answer's negative or huge
// memory_bytes neither lowers nor wraps a total of real ones.
func TestMemoryFiguresCannotCancelOut(t *testing.T) {
	tests := []struct {
		name   string
		memory string
		want   int64
	}{
		{"real", "1073741824", 1 << 30},
		{"negative", "-1073741824", 0},
		{"most negative", "-9223372036854775808", 0},
		{"largest", "9223372036854775807", math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := DecodeSessions([]byte(`[{"session_id":"s","status":"idle","connected":false,"idle_seconds":1,"resource_usage":{"memory_bytes":` + tt.memory + `}}]`))
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Sessions[0].MemoryBytes(); got != tt.want {
				t.Errorf("MemoryBytes %d, want %d", got, tt.want)
			}
		})
	}
	sums := []struct{ a, b, want int64 }{
		{1 << 30, 1 << 30, 2 << 30},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 1, math.MaxInt64 - 1, math.MaxInt64},
		{0, 0, 0},
	}
	for _, s := range sums {
		if got := AddBytes(s.a, s.b); got != s.want {
			t.Errorf("AddBytes(%d, %d) = %d, want %d", s.a, s.b, got, s.want)
		}
	}
}

// TestDecodeSessionsCostsItsBytes: an answer of sessions that are not
// (16 MiB of "{},", each hundreds of bytes once decoded) is refused at the
// first, costing little more than the body's bytes.
func TestDecodeSessionsCostsItsBytes(t *testing.T) {
	body := []byte("[" + strings.Repeat("{},", MaxSessionsBody/3-1) + "{}]")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := DecodeSessions(body)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrShape) {
		t.Fatalf("err %v, want ErrShape", err)
	}
	// The decoder's buffer grows by doubling until it holds the body.
	if got := after.TotalAlloc - before.TotalAlloc; got > 8*uint64(len(body)) {
		t.Errorf("decoding %d bytes allocated %d MiB", len(body), got>>20)
	}
}

// serve runs handler on a fresh Unix socket and returns its path.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kc-1.sock")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		srv.Close()
	})
	return p
}

func TestClient(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	answer := func(code int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.Header.Get("Accept") != "application/json" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			switch r.URL.Path {
			case "/status", "/sessions":
				w.WriteHeader(code)
				w.Write([]byte(body))
			default:
				http.NotFound(w, r)
			}
		}
	}
	refused := filepath.Join(t.TempDir(), "kc-2.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: refused, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()

	c := &Client{DialTimeout: 200 * time.Millisecond, Timeout: 300 * time.Millisecond, MaxBody: 1024}
	tests := []struct {
		name  string
		sock  string
		check func(error) bool
		pid   int
	}{
		{"ok", serve(t, answer(200, statusOK)), nil, 4242},
		{"500", serve(t, answer(500, "boom")), func(err error) bool {
			var he *HTTPError
			return errors.As(err, &he) && he.Code == 500 && he.Body == "boom"
		}, 0},
		{"bad json", serve(t, answer(200, "{")), func(err error) bool { return errors.Is(err, ErrBadJSON) }, 0},
		{"wrong shape", serve(t, answer(200, "[]")), func(err error) bool { return errors.Is(err, ErrShape) }, 0},
		{"hung", serve(t, func(w http.ResponseWriter, r *http.Request) { hangUntil(r, hang) }), IsTimeout, 0},
		{"refused", refused, IsRefused, 0},
		{"missing", filepath.Join(t.TempDir(), "nope.sock"), IsNotExist, 0},
		{"too large", serve(t, answer(200, `{"process_id":1,"x":"`+strings.Repeat("a", 4096)+`"}`)), func(err error) bool { return errors.Is(err, ErrTooLarge) }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			st, err := c.Status(context.Background(), tt.sock)
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("took %v, want bounded by the client timeout", el)
			}
			if tt.check == nil {
				if err != nil {
					t.Fatal(err)
				}
				if st.ProcessID != tt.pid {
					t.Errorf("pid %d want %d", st.ProcessID, tt.pid)
				}
				return
			}
			if err == nil || !tt.check(err) {
				t.Fatalf("err %v (%T)", err, err)
			}
			if !strings.Contains(err.Error(), tt.sock) {
				t.Errorf("error %q does not name the socket", err)
			}
		})
	}

	t.Run("sessions", func(t *testing.T) {
		for _, body := range []string{`{"total":1,"sessions":[` + sessionObj + `]}`, `[` + sessionObj + `]`} {
			l, err := c.Sessions(context.Background(), serve(t, answer(200, body)))
			if err != nil {
				t.Fatal(err)
			}
			if l.Total != 1 || l.Sessions[0].SessionID != "python-1234abcd" {
				t.Errorf("%+v", l)
			}
		}
		_, err := c.Sessions(context.Background(), serve(t, answer(404, "")))
		var he *HTTPError
		if !errors.As(err, &he) || he.Code != 404 {
			t.Errorf("err %v", err)
		}
	})

	t.Run("caller deadline wins", func(t *testing.T) {
		sock := serve(t, func(w http.ResponseWriter, r *http.Request) { hangUntil(r, hang) })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		slow := &Client{Timeout: time.Minute}
		start := time.Now()
		if _, err := slow.Status(ctx, sock); !IsTimeout(err) {
			t.Fatalf("err %v", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("took %v", el)
		}
	})
}

func hangUntil(r *http.Request, hang chan struct{}) {
	select {
	case <-hang:
	case <-r.Context().Done():
	}
}

// reencode checks that a successful decode survives a round trip.
func reencode(t *testing.T, v any, decode func([]byte) (any, error)) {
	b1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %+v: %v", v, err)
	}
	v2, err := decode(b1)
	if err != nil {
		t.Fatalf("decode of re-encoded %s: %v", b1, err)
	}
	b2, err := json.Marshal(v2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("round trip changed\n%s\n%s", b1, b2)
	}
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add([]byte(statusOK))
	f.Add([]byte(`{"process_id":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeStatus(data)
		if err != nil {
			if !errors.Is(err, ErrBadJSON) && !errors.Is(err, ErrShape) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		reencode(t, st, func(b []byte) (any, error) { return DecodeStatus(b) })
	})
}

func FuzzDecodeSessions(f *testing.F) {
	f.Add([]byte(`{"total":1,"sessions":[` + sessionObj + `]}`))
	f.Add([]byte(`[` + sessionObj + `]`))
	f.Add([]byte(`{"sessions":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := DecodeSessions(data)
		if err != nil {
			if !errors.Is(err, ErrBadJSON) && !errors.Is(err, ErrShape) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		for _, s := range l.Sessions {
			if s.SessionID == "" {
				t.Fatalf("accepted a session without an id: %s", data)
			}
		}
		reencode(t, l, func(b []byte) (any, error) { return DecodeSessions(b) })
	})
}

// TestRetryAfter: with RetryAfter, a request nobody answered is tried once
// more after the pause; an answer (even an error one) is not retried.
func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name      string
		first     func(c net.Conn) // what the first connection gets
		retry     time.Duration
		wantErr   bool
		wantConns int
	}{
		{"dropped, then answered", func(c net.Conn) { c.Close() }, 50 * time.Millisecond, false, 2},
		{"dropped, no retry", func(c net.Conn) { c.Close() }, 0, true, 1},
		{"an HTTP error is an answer", func(c net.Conn) {
			c.Write([]byte("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			c.Close()
		}, 50 * time.Millisecond, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "kc-1.sock")
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			conns := make(chan int, 4)
			go func() {
				for n := 1; ; n++ {
					c, err := l.Accept()
					if err != nil {
						return
					}
					conns <- n
					if n == 1 {
						buf := make([]byte, 4096)
						c.Read(buf)
						tt.first(c)
						continue
					}
					buf := make([]byte, 4096)
					c.Read(buf)
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(statusOK), statusOK)
					c.Close()
				}
			}()
			c := &Client{Timeout: time.Second, RetryAfter: tt.retry}
			_, err = c.Status(context.Background(), p)
			if (err != nil) != tt.wantErr {
				t.Errorf("err %v, wantErr %v", err, tt.wantErr)
			}
			if got := len(conns); got != tt.wantConns {
				t.Errorf("%d connections, want %d", got, tt.wantConns)
			}
		})
	}
}

// TestSessionFieldsAreClipped: whoever serves a socket in /tmp chooses a
// session's fields, and cull prints them in its audit log, its report and
// the journal: one field of a 16 MiB answer must not be a 16 MiB line.
// Errors that quote a field are cut too.
func TestSessionFieldsAreClipped(t *testing.T) {
	huge := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	in := `[{"session_id":"` + huge + `","status":"` + huge + `","language":"` + huge + `","working_directory":"/` + huge + `","connected":false,"idle_seconds":1}]`
	l, err := DecodeSessions([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	s := l.Sessions[0]
	for name, tc := range map[string]struct {
		got string
		max int
	}{
		"session_id":        {s.SessionID, clipID},
		"status":            {s.Status, clipID},
		"language":          {s.Language, clipID},
		"working_directory": {s.WorkingDirectory, clipPath},
	} {
		if len(tc.got) > tc.max+32 || !utf8.ValidString(tc.got) || !strings.HasSuffix(tc.got, "bytes)") {
			t.Errorf("%s: %d bytes (valid UTF-8: %v), want at most about %d, marked as cut", name, len(tc.got), utf8.ValidString(tc.got), tc.max)
		}
	}
	for _, in := range []string{
		`[{"session_id":"` + huge + `","connected":false,"idle_seconds":1}]`,
		`[{"session_id":"s","status":"idle","connected":false,"idle_seconds":"` + huge + `"}]`,
		`[{"session_id":"s","status":"idle","connected":false,"idle_seconds":1` + strings.Repeat("0", 1<<20) + `}]`,
	} {
		if _, err := DecodeSessions([]byte(in)); err == nil || len(err.Error()) > 1024 {
			t.Errorf("error of %d bytes (%.80v), want under 1 KiB", len(fmt.Sprint(err)), err)
		}
	}
}

// TestAnswered: what a retry would only get again is an answer; a
// dropped connection, a timeout, or no room left in the budget (what
// other answers leave) is not.
func TestAnswered(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&HTTPError{Code: 500}, true},
		{fmt.Errorf("GET /status: %w", ErrBadJSON), true},
		{fmt.Errorf("GET /status: %w", ErrShape), true},
		{fmt.Errorf("GET /status: %w", ErrTooLarge), true},
		{fmt.Errorf("GET /sessions: %w: 64 bytes read", ErrNoRoom), false},
		{fmt.Errorf("GET /status: %w", context.DeadlineExceeded), false},
		{fmt.Errorf("GET /status: %w", syscall.ECONNRESET), false},
	} {
		t.Run(tt.err.Error(), func(t *testing.T) {
			if got := Answered(tt.err); got != tt.want {
				t.Errorf("Answered(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
