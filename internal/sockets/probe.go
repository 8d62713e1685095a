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
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
)

// soAcceptCon is __SO_ACCEPTCON in /proc/net/unix's Flags: a listener.
const soAcceptCon = 1 << 16

// listeners is the set of paths with a listening Unix socket in one
// network namespace, from its /proc/<pid>/net/unix.
type listeners map[string]bool

// readListeners reads the listening Unix socket paths of the network
// namespace of pid (0: our own).
func readListeners(procRoot string, pid int) (listeners, error) {
	p := procRoot + "/self/net/unix"
	if pid > 0 {
		p = procRoot + "/" + strconv.Itoa(pid) + "/net/unix"
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseNetUnix(f)
}

// parseNetUnix parses /proc/net/unix:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 12345 /tmp/kc-1.sock
//
// The path is everything after the seventh field (it may hold spaces);
// abstract sockets ("@…") and unnamed ones are skipped.
func parseNetUnix(r io.Reader) (listeners, error) {
	out := listeners{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	first := true
	for sc.Scan() {
		line := sc.Bytes()
		if first {
			first = false
			if bytes.HasPrefix(line, []byte("Num")) {
				continue
			}
		}
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
		flags, err := strconv.ParseUint(string(fields[3]), 16, 32)
		if err != nil {
			return nil, fmt.Errorf("net/unix: flags %q: %w", fields[3], err)
		}
		if flags&soAcceptCon != 0 {
			out[path] = true
		}
	}
	return out, sc.Err()
}

// listenGate is gate 2: does anything listen on the socket? dialPath
// reaches the socket; innerPath is the path a listener in the socket's
// network namespace would show in net/unix.
func listenGate(dialPath, innerPath string, ls listeners, timeout time.Duration) (say, string) {
	c, err := net.DialTimeout("unix", dialPath, timeout)
	if err == nil {
		c.Close()
		return sayLive, "listening"
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return sayStale, "connect refused"
	case errors.Is(err, syscall.ENOENT):
		return sayUnsure, "vanished while probed"
	case ls[innerPath]:
		// A listener whose accept queue is full (a hung server) makes
		// connect time out or fail with EAGAIN.
		return sayLive, fmt.Sprintf("listener in net/unix (connect: %v)", errors.Unwrap(err))
	case ls == nil:
		return sayUnsure, fmt.Sprintf("connect: %v", err)
	}
	return sayUnsure, fmt.Sprintf("no listener in net/unix, but connect: %v", err)
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
			return sayStale, "/status answers with process_id " + strconv.Itoa(t.pid)
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
