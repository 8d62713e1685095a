package sockets

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
)

// soAcceptCon is __SO_ACCEPTCON in /proc/net/unix's Flags: a listener.
const soAcceptCon = 1 << 16

// unixSocket is one socket in /proc/net/unix that carries a path.
type unixSocket struct {
	inode     uint64 // in sockfs: not the inode of the file at the path
	state     uint8  // St: 1 unconnected, 2 connecting, 3 connected, 4 disconnecting
	listening bool
}

// netUnix is every Unix socket bound to a path in one network namespace,
// in any state, by that path as the binding process gave it to bind(2),
// from its /proc/<pid>/net/unix. nil means the table could not be read.
//
// A path listed here is held by a live socket even when the socket does
// not listen: bound and not yet listening, a client bound to the name, or
// a connection accepted on it (the kernel lists those under their
// listener's path). The socket may even belong to a file that was since
// unlinked and replaced; the path is held all the same.
type netUnix map[string][]unixSocket

// listening reports whether a socket bound to p listens.
func (n netUnix) listening(p string) bool {
	for _, s := range n[p] {
		if s.listening {
			return true
		}
	}
	return false
}

// holders describes the sockets bound to p for a reason, e.g.
// "socket inode 4711 (unconnected)".
func (n netUnix) holders(p string) string {
	const most = 3
	var parts []string
	for i, s := range n[p] {
		if i == most {
			parts = append(parts, fmt.Sprintf("%d more", len(n[p])-most))
			break
		}
		parts = append(parts, fmt.Sprintf("socket inode %d (%s)", s.inode, stateName(s)))
	}
	return strings.Join(parts, ", ")
}

func stateName(s unixSocket) string {
	if s.listening {
		return "listening"
	}
	switch s.state {
	case 1:
		return "unconnected"
	case 2:
		return "connecting"
	case 3:
		return "connected"
	case 4:
		return "disconnecting"
	}
	return fmt.Sprintf("state %02x", s.state)
}

// readNetUnix reads the Unix socket table of the network namespace of pid
// (0: our own).
func readNetUnix(procRoot string, pid int) (netUnix, error) {
	p := procRoot + "/self/net/unix"
	if pid > 0 {
		p = procRoot + "/" + strconv.Itoa(pid) + "/net/unix"
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := parseNetUnix(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

// errNetUnixFormat is returned (wrapped) for a net/unix whose header is
// not the one parseNetUnix knows.
var errNetUnixFormat = errors.New("unexpected net/unix format")

// parseNetUnix parses /proc/net/unix:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 12345 /tmp/kc-1.sock
//
// The path is everything after the seventh field (it may hold spaces);
// abstract sockets ("@…") and unnamed ones are skipped.
func parseNetUnix(r io.Reader) (netUnix, error) {
	out := netUnix{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	// An unknown layout is an error rather than an empty table: an empty
	// table would call every socket unbound.
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("no header: %w", errNetUnixFormat)
	}
	if h := bytes.Fields(sc.Bytes()); len(h) < 8 || string(h[0]) != "Num" || string(h[3]) != "Flags" ||
		string(h[5]) != "St" || string(h[6]) != "Inode" || string(h[7]) != "Path" {
		return nil, fmt.Errorf("header %q: %w", sc.Bytes(), errNetUnixFormat)
	}
	for sc.Scan() {
		line := sc.Bytes()
		rest := line
		var fields [7][]byte
		ok := true
		for i := range fields {
			rest = bytes.TrimLeft(rest, " ")
			j := bytes.IndexByte(rest, ' ')
			if j < 0 {
				if i < 6 {
					ok = false
					break
				}
				fields[i], rest = rest, nil
				break
			}
			fields[i], rest = rest[:j], rest[j+1:]
		}
		if !ok {
			continue
		}
		path := string(bytes.TrimLeft(rest, " "))
		if path == "" || path[0] == '@' {
			continue
		}
		flags, err1 := strconv.ParseUint(string(fields[3]), 16, 32)
		state, err2 := strconv.ParseUint(string(fields[5]), 16, 8)
		inode, err3 := strconv.ParseUint(string(fields[6]), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			// The kernel prints a path as is, newlines included, so a
			// line that does not parse is the tail of someone's path:
			// failing the whole table on it would let any user who can
			// bind a socket switch this evidence off.
			continue
		}
		out[path] = append(out[path], unixSocket{inode: inode, state: uint8(state), listening: flags&soAcceptCon != 0})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// listenGate is gate 2: does a live socket hold the path? dialPath
// reaches the socket; innerPath is the path a socket bound in the socket's
// network namespace would show in net/unix (nil nu: unread).
//
// connect(2) refused is not enough to call it stale: a socket bound and
// not (yet, or ever) listening refuses too, and so does the name of a
// client socket bound to it. Only a path that no socket in net/unix
// carries is free; any socket there means a live process holds it.
func listenGate(dialPath, innerPath string, nu netUnix, timeout time.Duration) (say, string) {
	c, err := net.DialTimeout("unix", dialPath, timeout)
	if err == nil {
		c.Close()
		return sayLive, "listening"
	}
	cause := err
	if errors.Is(err, syscall.ECONNREFUSED) {
		cause = syscall.ECONNREFUSED
	} else if u := errors.Unwrap(err); u != nil {
		cause = u
	}
	switch {
	case errors.Is(err, syscall.ENOENT):
		return sayUnsure, "vanished while probed"
	case nu.listening(innerPath):
		// A listener whose accept queue is full (a hung server) makes
		// connect time out or fail with EAGAIN.
		return sayLive, fmt.Sprintf("listener in net/unix (connect: %v)", cause)
	case len(nu[innerPath]) > 0:
		return sayLive, fmt.Sprintf("not listening (connect: %v), but bound in net/unix: a live process holds it (%s)", cause, nu.holders(innerPath))
	case nu == nil:
		return sayUnsure, fmt.Sprintf("connect: %v, and net/unix unread: cannot tell whether a process holds it", cause)
	case errors.Is(err, syscall.ECONNREFUSED):
		return sayStale, "connect refused, and not bound in net/unix"
	}
	return sayUnsure, fmt.Sprintf("not bound in net/unix, but connect: %v", err)
}

// statusTry is one GET /status attempt of gate 3.
type statusTry struct {
	answered bool
	pid      int    // process_id answered
	err      error  // why it was silent
	other    string // answered, but not a Kallichore status
}

func tryStatus(ctx context.Context, c *kallichore.Client, dialPath string) statusTry {
	st, err := c.Status(ctx, dialPath)
	if err == nil {
		return statusTry{answered: true, pid: st.ProcessID}
	}
	var he *kallichore.HTTPError
	if errors.As(err, &he) || errors.Is(err, kallichore.ErrBadJSON) || errors.Is(err, kallichore.ErrShape) {
		// Something answers, but it is not a Kallichore /status.
		return statusTry{answered: true, other: trimErr(err)}
	}
	return statusTry{err: err}
}

// statusGate is gate 3's decision on one or two attempts.
func statusGate(pid int, tries ...statusTry) (say, string) {
	if len(tries) == 0 {
		return sayUnsure, "/status not asked"
	}
	last := tries[len(tries)-1]
	for _, t := range tries {
		switch {
		case t.answered && t.other != "":
			return sayUnsure, "something answers /status, but not Kallichore: " + t.other
		case t.answered && t.pid == pid:
			return sayLive, "/status answers with process_id " + strconv.Itoa(pid)
		case t.answered:
			// Not evidence of death: someone answers. The name may be
			// another server's socket under this PID, or a hashed session
			// name made only of digits, which reads exactly like
			// kc-<pid>.sock. Either way the PID check and /status
			// disagree, and that is unknown.
			return sayUnsure, fmt.Sprintf("/status answers with process_id %d, not %d (another server's socket, or a hashed session name that reads as a PID)", t.pid, pid)
		}
	}
	if len(tries) < 2 {
		return sayUnsure, "/status silent once: " + probeErr(last.err)
	}
	return sayStale, "/status silent twice: " + probeErr(last.err)
}

func probeErr(err error) string {
	switch {
	case kallichore.IsRefused(err):
		return "connection refused"
	case kallichore.IsTimeout(err):
		return "timed out"
	case kallichore.IsNotExist(err):
		return "no such file"
	}
	return trimErr(err)
}

// trimErr drops the "GET /status on <path>:" prefix, which names the
// internal /proc/self/fd path.
func trimErr(err error) string {
	s := err.Error()
	if i := bytes.LastIndex([]byte(s), []byte(".sock: ")); i >= 0 {
		return s[i+len(".sock: "):]
	}
	return s
}
