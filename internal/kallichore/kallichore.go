// Package kallichore is a small read-only client for the Kallichore kernel
// supervisor (kcserver): GET /status and GET /sessions, HTTP/1.1 over its
// Unix socket, with short dial and total timeouts so that a hung supervisor
// cannot stall a sweep.
//
// Decoding is tolerant of fields it does not know (newer Kallichore versions
// add some) and of the older /sessions shape (a bare JSON list), and strict
// about the fields kc-watchman bases decisions on: a /status answer without
// process_id, or a session without session_id, status, connected or
// idle_seconds, is an error (ErrShape), never a zero value.
package kallichore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"syscall"
	"time"
	"unicode/utf8"
)

// Default timeouts, the seed culler's: connect within 3 s, the whole
// answer within 5 s. Kallichore usually answers in well under a
// millisecond, but a busy one (a kernel starting, a loaded host) can take
// seconds, and a live supervisor taken for a silent one is reported as
// unreadable (cull) or unknown (sweep).
const (
	DefaultDialTimeout = 3 * time.Second
	DefaultTimeout     = 5 * time.Second
)

// Caps on an answer's body, by what was asked. No answer over its cap is
// read: a /status is a few hundred bytes and a /sessions a few hundred per
// session, and a socket in /tmp can be anyone's, serving whatever it likes
// to a janitor running as root.
const (
	MaxStatusBody   = 1 << 20
	MaxSessionsBody = 16 << 20
)

var (
	// ErrBadJSON is returned (wrapped) when an answer is not valid JSON.
	ErrBadJSON = errors.New("invalid JSON")
	// ErrShape is returned (wrapped) when an answer is JSON but not the
	// documented schema: wrong type, or a field decisions rely on missing.
	ErrShape = errors.New("unexpected JSON shape")
	// ErrTooLarge is returned (wrapped) when an answer is over its cap
	// (MaxStatusBody, MaxSessionsBody or Client.MaxBody).
	ErrTooLarge = errors.New("answer too large")
	// ErrNoRoom is returned (wrapped) when an answer outgrew what other
	// answers left of the Budget.
	ErrNoRoom = errors.New("answer larger than the memory left to read it in")
)

// HTTPError is returned for an answer whose status code is not 200.
type HTTPError struct {
	Code int
	Body string // first bytes of the body, for the log
}

func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("HTTP %d", e.Code)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body)
}

// ServerStatus is Kallichore's answer to GET /status.
type ServerStatus struct {
	Sessions      int    `json:"sessions"`
	Active        int    `json:"active"`
	Busy          bool   `json:"busy"`
	IdleSeconds   int64  `json:"idle_seconds"`
	BusySeconds   int64  `json:"busy_seconds"`
	UptimeSeconds int64  `json:"uptime_seconds"`
	Version       string `json:"version"`
	ProcessID     int    `json:"process_id"`
	Started       string `json:"started"`
	ServerID      string `json:"server_id,omitempty"`
}

// SessionList is Kallichore's answer to GET /sessions.
type SessionList struct {
	Total    int             `json:"total"`
	Sessions []ActiveSession `json:"sessions"`
}

// ActiveSession is one kernel session. Fields kc-watchman does not
// interpret are kept raw.
type ActiveSession struct {
	SessionID          string          `json:"session_id"`
	Argv               []string        `json:"argv,omitempty"`
	Username           string          `json:"username,omitempty"`
	DisplayName        string          `json:"display_name,omitempty"`
	Language           string          `json:"language,omitempty"`
	InterruptMode      string          `json:"interrupt_mode,omitempty"`
	Connected          bool            `json:"connected"`
	Started            string          `json:"started,omitempty"`
	SessionMode        string          `json:"session_mode,omitempty"`
	WorkingDirectory   string          `json:"working_directory,omitempty"`
	InputPrompt        string          `json:"input_prompt,omitempty"`
	ContinuationPrompt string          `json:"continuation_prompt,omitempty"`
	ExecutionQueue     json.RawMessage `json:"execution_queue,omitempty"`
	Status             string          `json:"status"`
	KernelInfo         json.RawMessage `json:"kernel_info,omitempty"`
	IdleSeconds        int64           `json:"idle_seconds"`
	BusySeconds        int64           `json:"busy_seconds"`
	ProcessID          int             `json:"process_id,omitempty"`
	NotebookURI        string          `json:"notebook_uri,omitempty"`
	SocketPath         string          `json:"socket_path,omitempty"`
	ResourceUsage      *ResourceUsage  `json:"resource_usage,omitempty"`
}

// ResourceUsage is a session's last resource sample. The schema says
// int64 throughout; fractional numbers are accepted and truncated.
type ResourceUsage struct {
	CPUPercent       Number `json:"cpu_percent"`
	MemoryBytes      Number `json:"memory_bytes"`
	ThreadCount      Number `json:"thread_count"`
	SamplingPeriodMS Number `json:"sampling_period_ms"`
	Timestamp        Number `json:"timestamp"`
}

// Number is an int64 that also decodes from a JSON number with a fraction
// (truncated) or null (zero).
type Number int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Number) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = 0
		return nil
	}
	if len(b) == 0 || b[0] == '"' {
		return fmt.Errorf("want a number, got %s", clip(string(b), 64))
	}
	var v json.Number
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if i, err := v.Int64(); err == nil {
		*n = Number(i)
		return nil
	}
	f, err := v.Float64()
	if err != nil || f > 9.2e18 || f < -9.2e18 {
		return fmt.Errorf("number %s out of range", clip(string(v), 64))
	}
	*n = Number(int64(f))
	return nil
}

// MemoryBytes returns the session's sampled memory, 0 when unknown or
// negative: anyone can serve a socket in /tmp, and a negative figure
// would cancel other supervisors' real ones out of every total.
func (s ActiveSession) MemoryBytes() int64 {
	if s.ResourceUsage == nil {
		return 0
	}
	return max(0, int64(s.ResourceUsage.MemoryBytes))
}

// AddBytes is a+b for the non-negative byte counts of sessions, held at
// the largest int64 instead of wrapping: a few made-up answers of huge
// figures must not wrap a total to a small one.
func AddBytes(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// wire types: pointers mark the fields that must be present.
type wireStatus struct {
	ServerStatus
	ProcessID *int `json:"process_id"`
}

type wireSession struct {
	ActiveSession
	SessionID   *string `json:"session_id"`
	Status      *string `json:"status"`
	Connected   *bool   `json:"connected"`
	IdleSeconds *int64  `json:"idle_seconds"`
}

type wireList struct {
	Total    *int         `json:"total"`
	Sessions *sessionList `json:"sessions"`
}

// maxSessions bounds the sessions one answer may list. Kallichore runs a
// kernel process for each; a longer list is no supervisor's, and decoded
// whole it would cost far more than its bytes ("{}," is 3 bytes of the
// body and hundreds once decoded).
const maxSessions = 4096

// sessionList is a JSON list of sessions decoded one at a time, each
// checked as it comes: an answer costs what its valid sessions do, and
// the first that is not one ends the decoding.
type sessionList []ActiveSession

func (l *sessionList) UnmarshalJSON(data []byte) error {
	// The decoder calling this has checked the syntax of all of data. Of
	// a list given twice the last is kept, and each must be valid.
	*l = nil
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return fmt.Errorf("%w: the sessions are not a list", ErrShape)
	}
	for i := 0; dec.More(); i++ {
		if i == maxSessions {
			return fmt.Errorf("%w: more than %d sessions", ErrShape, maxSessions)
		}
		var w wireSession
		if err := dec.Decode(&w); err != nil {
			return fmt.Errorf("%w: session %d: %s", ErrShape, i, clip(err.Error(), clipError))
		}
		s, err := checkSession(&w)
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		*l = append(*l, s)
	}
	return nil
}

// DecodeStatus decodes a /status answer.
func DecodeStatus(data []byte) (ServerStatus, error) {
	return decodeStatus(bytes.NewReader(data))
}

// decodeStatus decodes a /status answer as it is read from r: the body
// is never held as a whole next to what is decoded from it.
func decodeStatus(r io.Reader) (ServerStatus, error) {
	var w wireStatus
	if err := decodeOne(r, &w); err != nil {
		return ServerStatus{}, fmt.Errorf("status: %w", err)
	}
	if w.ProcessID == nil {
		return ServerStatus{}, fmt.Errorf("status: %w: no process_id", ErrShape)
	}
	st := w.ServerStatus
	st.ProcessID = *w.ProcessID
	return st, nil
}

// DecodeSessions decodes a /sessions answer: {"total": n, "sessions": [...]}
// or, from older Kallichore versions, a bare list of sessions. A missing
// total is taken to be the number of sessions.
func DecodeSessions(data []byte) (SessionList, error) {
	return decodeSessions(bytes.NewReader(data))
}

func decodeSessions(r io.Reader) (SessionList, error) {
	br := bufio.NewReader(r)
	first, err := firstByte(br)
	if err != nil {
		return SessionList{}, fmt.Errorf("sessions: %w", err)
	}
	var list sessionList
	total := -1
	switch first {
	case '[':
		if err := decodeOne(br, &list); err != nil {
			return SessionList{}, fmt.Errorf("sessions: %w", err)
		}
	case '{':
		var w wireList
		if err := decodeOne(br, &w); err != nil {
			return SessionList{}, fmt.Errorf("sessions: %w", err)
		}
		if w.Sessions == nil {
			return SessionList{}, fmt.Errorf("sessions: %w: object without a sessions list", ErrShape)
		}
		list = *w.Sessions
		if w.Total != nil {
			total = *w.Total
		}
	default:
		// Whatever it is, it must at least be JSON to be called a shape.
		if err := decodeOne(br, new(json.RawMessage)); err != nil {
			return SessionList{}, fmt.Errorf("sessions: %w", err)
		}
		return SessionList{}, fmt.Errorf("sessions: %w: neither an object nor a list", ErrShape)
	}
	out := SessionList{Sessions: list}
	if out.Sessions == nil {
		out.Sessions = []ActiveSession{}
	}
	out.Total = total
	if total < 0 {
		out.Total = len(out.Sessions)
	}
	return out, nil
}

// firstByte returns the first byte of r that is not JSON white space,
// leaving it unread.
func firstByte(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.ReadByte()
		switch {
		case errors.Is(err, io.EOF):
			return 0, ErrBadJSON
		case err != nil:
			return 0, err
		case b == ' ' || b == '\t' || b == '\n' || b == '\r':
			continue
		}
		return b, br.UnreadByte()
	}
}

// decodeOne decodes the one JSON value r holds into v, streaming: syntax
// errors (and an empty or truncated answer, or anything after the value)
// are ErrBadJSON, a valid value of the wrong type ErrShape, and an error
// of r itself (a cap exceeded, a connection reset) is returned as is.
func decodeOne(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	err := dec.Decode(v)
	if err == nil {
		// One value and nothing but white space after it.
		if _, err = dec.Token(); errors.Is(err, io.EOF) {
			return nil
		} else if err == nil {
			return fmt.Errorf("%w: more than one JSON value", ErrBadJSON)
		}
	}
	var se *json.SyntaxError
	var re *readError
	switch {
	case errors.As(err, &re):
		return re.err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &se):
		return fmt.Errorf("%w: %s", ErrBadJSON, clip(err.Error(), clipError))
	case errors.Is(err, ErrShape):
		return err
	}
	return fmt.Errorf("%w: %s", ErrShape, clip(err.Error(), clipError))
}

// readError marks an error of the reader under a decoder, so that it is
// not taken for a fault of the JSON.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }

// capReader reads at most n bytes from r and fails, rather than stopping
// short, when there are more: a body cut at the cap would only decode as
// truncated JSON.
type capReader struct {
	r io.Reader
	n int64 // bytes left under the cap
	// cap is the figure the error names.
	cap int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		// One byte more tells a body of exactly the cap from a longer one.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, &readError{fmt.Errorf("%w: answer over %d bytes", ErrTooLarge, c.cap)}
		}
		return 0, readErr(err)
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	return n, readErr(err)
}

// readErr marks err, from the reader under capReader, as a reader's
// error; EOF stays EOF, and a reader's error (the budget's) stays as it
// is.
func readErr(err error) error {
	var re *readError
	if err == nil || errors.Is(err, io.EOF) || errors.As(err, &re) {
		return err
	}
	return &readError{fmt.Errorf("reading answer: %w", err)}
}

func checkSession(w *wireSession) (ActiveSession, error) {
	switch {
	case w.SessionID == nil || *w.SessionID == "":
		return ActiveSession{}, fmt.Errorf("%w: no session_id", ErrShape)
	case w.Status == nil:
		return ActiveSession{}, fmt.Errorf("%w: session %q: no status", ErrShape, clip(*w.SessionID, clipID))
	case w.Connected == nil:
		return ActiveSession{}, fmt.Errorf("%w: session %q: no connected", ErrShape, clip(*w.SessionID, clipID))
	case w.IdleSeconds == nil:
		return ActiveSession{}, fmt.Errorf("%w: session %q: no idle_seconds", ErrShape, clip(*w.SessionID, clipID))
	}
	s := w.ActiveSession
	s.SessionID, s.Status, s.Connected, s.IdleSeconds = *w.SessionID, *w.Status, *w.Connected, *w.IdleSeconds
	// What a report or log line prints of a session is cut: anyone can
	// serve a socket in /tmp, and one field of a 16 MiB answer would
	// otherwise be a 16 MiB line in the audit log and the journal.
	s.SessionID, s.Status, s.Language = clip(s.SessionID, clipID), clip(s.Status, clipID), clip(s.Language, clipID)
	s.WorkingDirectory = clip(s.WorkingDirectory, clipPath)
	return s, nil
}

// The most of a session's field kept: an ID or a word, and a path
// (PATH_MAX); and of a decoder's error, which may quote the answer.
const (
	clipID    = 256
	clipPath  = 4096
	clipError = 512
)

// clip cuts s to at most n bytes, on a rune boundary, marking the cut
// within the n bytes: a clipped string clips to itself.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	mark := fmt.Sprintf("…(%d bytes)", len(s))
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// Client talks to supervisors. The zero value uses the default timeouts
// and caps and no budget.
type Client struct {
	// DialTimeout bounds connect(2) on the socket.
	DialTimeout time.Duration
	// Timeout bounds a whole request, connect to last byte.
	Timeout time.Duration
	// MaxBody, when positive, replaces both caps (MaxStatusBody,
	// MaxSessionsBody); for tests.
	MaxBody int64
	// Budget, when set, bounds the bytes of answers being read at once
	// by every client sharing it.
	Budget *Budget
	// RetryAfter, when positive, makes a request that got no answer at all
	// (refused, timed out, reset, or cut for want of room in the Budget;
	// not an HTTP or JSON error) be tried once more after this pause, as
	// the seed culler does.
	RetryAfter time.Duration
}

// DefaultClient is used by the package-level functions.
var DefaultClient = &Client{}

// Status asks the supervisor listening on socketPath for its status.
func Status(ctx context.Context, socketPath string) (ServerStatus, error) {
	return DefaultClient.Status(ctx, socketPath)
}

// Sessions asks the supervisor listening on socketPath for its sessions.
func Sessions(ctx context.Context, socketPath string) (SessionList, error) {
	return DefaultClient.Sessions(ctx, socketPath)
}

// Socket is a supervisor's socket as the client reaches it: Dial is the
// path connect(2) is given, Name the one errors show. They differ for a
// socket held open and dialled through /proc/self/fd (sockets.Pin).
type Socket struct {
	Dial, Name string
	// Owner keys who owns the socket file: the answers of one owner
	// share half of the Budget (0: none, as the host root's own).
	Owner int
}

// Status performs GET /status.
func (c *Client) Status(ctx context.Context, socketPath string) (ServerStatus, error) {
	return c.StatusOf(ctx, Socket{Dial: socketPath, Name: socketPath})
}

// StatusOf performs GET /status on s.
func (c *Client) StatusOf(ctx context.Context, s Socket) (ServerStatus, error) {
	var st ServerStatus
	err := c.get(ctx, s, "/status", MaxStatusBody, func(r io.Reader) (err error) {
		st, err = decodeStatus(r)
		return err
	})
	return st, err
}

// Sessions performs GET /sessions.
func (c *Client) Sessions(ctx context.Context, socketPath string) (SessionList, error) {
	return c.SessionsOf(ctx, Socket{Dial: socketPath, Name: socketPath})
}

// SessionsOf performs GET /sessions on s.
func (c *Client) SessionsOf(ctx context.Context, s Socket) (SessionList, error) {
	var l SessionList
	err := c.get(ctx, s, "/sessions", MaxSessionsBody, func(r io.Reader) (err error) {
		l, err = decodeSessions(r)
		return err
	})
	return l, err
}

func (c *Client) timeouts() (dial, total time.Duration) {
	dial, total = c.DialTimeout, c.Timeout
	if dial <= 0 {
		dial = DefaultDialTimeout
	}
	if total <= 0 {
		total = DefaultTimeout
	}
	return dial, total
}

func (c *Client) get(ctx context.Context, s Socket, path string, limit int64, decode func(io.Reader) error) error {
	err := c.getOnce(ctx, s, path, limit, decode)
	if err == nil || c.RetryAfter <= 0 || Answered(err) {
		return err
	}
	select {
	case <-time.After(c.RetryAfter):
	case <-ctx.Done():
		return err
	}
	return c.getOnce(ctx, s, path, limit, decode)
}

// Answered reports whether err came with an answer (so that asking again
// would only get the same one). An answer cut for want of room in the
// budget is not: the room is what other answers leave.
func Answered(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) || errors.Is(err, ErrBadJSON) || errors.Is(err, ErrShape) || errors.Is(err, ErrTooLarge)
}

// maxErrorBody is how much of a refusal's body is read for the log.
const maxErrorBody = 512

func (c *Client) getOnce(ctx context.Context, s Socket, path string, limit int64, decode func(io.Reader) error) error {
	socketPath := s.Name
	dial, total := c.timeouts()
	ctx, cancel := context.WithTimeout(ctx, total)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: dial}
			return d.DialContext(ctx, "unix", s.Dial)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
		MaxIdleConns:       -1,
		// Headers are bounded as bodies are: the default is 1 MiB.
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost"+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("GET %s on %s: %w", path, socketPath, err)
	}
	defer resp.Body.Close()
	if c.MaxBody > 0 {
		limit = c.MaxBody
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		body := string(bytes.TrimSpace(data))
		if len(body) > 200 {
			body = body[:200] + "…"
		}
		return fmt.Errorf("GET %s on %s: %w", path, socketPath, &HTTPError{Code: resp.StatusCode, Body: body})
	}
	if resp.ContentLength > limit {
		return fmt.Errorf("GET %s on %s: %w: answer over %d bytes (%d announced)", path, socketPath, ErrTooLarge, limit, resp.ContentLength)
	}
	// The budget is charged as the body arrives, announced length or
	// not: a server that announces its cap and sends nothing must not
	// hold all of the budget until its timeout while every other
	// supervisor's answer waits.
	charged := &chargedReader{ctx: ctx, r: resp.Body, b: c.Budget, own: c.Budget.ownerShare(s.Owner)}
	defer charged.release()
	if err := decode(&capReader{r: charged, n: limit, cap: limit}); err != nil {
		return fmt.Errorf("GET %s on %s: %w", path, socketPath, err)
	}
	return nil
}

// IsRefused reports whether err is a refused connection: a socket file
// with nothing listening on it.
func IsRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// IsNotExist reports whether err says the socket path does not exist.
func IsNotExist(err error) bool { return errors.Is(err, syscall.ENOENT) }

// IsTimeout reports whether err is a dial or request timeout.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
