package sweep

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

// errReplaced marks a name that no longer holds the socket it was found
// with when it is about to be dialled.
var errReplaced = errors.New("replaced since it was listed")

// dialSocket is gate 2's connect(2), bounded by timeout and ctx.
func dialSocket(ctx context.Context, dialPath string, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "unix", dialPath)
	if err == nil {
		c.Close()
	}
	return err
}

// judgeListen is gate 2's decision on what connect(2) said (err) and what
// net/unix says of innerPath and the socket file f found there (by its
// device and inode, where the table knows them: the binder's path may be
// another name of it). The connect is the same for every name of one
// socket; net/unix is asked about each name.
//
// connect(2) refused is not enough to call it stale: a socket bound and
// not (yet, or ever) listening refuses too, and so does the name of a
// client socket bound to it. Only a path that no socket in net/unix
// carries is free; any socket there means a live process holds it.
func judgeListen(err error, innerPath string, f sockets.File, nu sockets.NetUnix) (say, string) {
	if err == nil {
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
	case errors.Is(err, errReplaced):
		return sayUnsure, "not dialled: the name was " + errReplaced.Error()
	case sockets.Listening(nu.Held(innerPath, f)):
		// A listener whose accept queue is full (a hung server) makes
		// connect time out or fail with EAGAIN.
		return sayLive, fmt.Sprintf("listener in net/unix (connect: %v)", cause)
	case len(nu.Held(innerPath, f)) > 0:
		return sayLive, fmt.Sprintf("not listening (connect: %v), but bound in net/unix: a live process holds it (%s)", cause, sockets.Holders(nu.Held(innerPath, f)))
	case nu == nil:
		return sayUnsure, fmt.Sprintf("connect: %v, and net/unix unread: cannot tell whether a process holds it", cause)
	case errors.Is(err, syscall.ECONNREFUSED):
		return sayStale, "connect refused, and not bound in net/unix"
	}
	return sayUnsure, fmt.Sprintf("not bound in net/unix, but connect: %v", err)
}

// pin holds p's name open for dialling (sockets.PinAt) if it is still
// the socket inode it was listed as: a name replaced since, by another
// file or a mount, is not dialled (errReplaced), and a silence there
// would not be this socket's.
func (p *probe) pin() (path string, unpin func(), err error) {
	e := p.names[0].e
	pin, err := e.pin()
	if errors.Is(err, sockets.ErrChanged) || errors.Is(err, sockets.ErrNotSocket) {
		return "", nil, fmt.Errorf("%s: %w", e.name, errReplaced)
	}
	if err != nil {
		return "", nil, err
	}
	return pin.Path, pin.Release, nil
}

// pin is sockets.PinAt for e, and also sockets.ErrChanged where the
// name now holds another socket than e: device, inode and change time
// (tmpfs gives a socket bound again the same inode number at once).
func (e *entry) pin() (sockets.Pinned, error) {
	pin, err := sockets.PinAt(e.dir.fd, e.name)
	if err == nil && (pin.Stat.Dev != e.dev || pin.Stat.Ino != e.ino || pin.Stat.Ctim != e.ctime) {
		pin.Release()
		return sockets.Pinned{}, fmt.Errorf("%s: another socket: %w", e.name, sockets.ErrChanged)
	}
	return pin, err
}

// dial is gate 2's connect(2) to p's socket, pinned.
func (p *probe) dial(ctx context.Context, timeout time.Duration) error {
	path, unpin, err := p.pin()
	if err != nil {
		return err
	}
	defer unpin()
	return dialSocket(ctx, path, timeout)
}

// status is one of gate 3's GET /status tries on p's socket, pinned.
func (p *probe) status(ctx context.Context, c *kallichore.Client) statusTry {
	path, unpin, err := p.pin()
	if err != nil {
		return statusTry{replaced: err}
	}
	defer unpin()
	return tryStatus(ctx, c, kallichore.Socket{Dial: path, Name: p.names[0].e.name, Owner: p.names[0].Owner})
}

// statusTry is one GET /status attempt of gate 3.
type statusTry struct {
	answered bool
	pid      int    // process_id answered
	err      error  // why it was silent
	other    string // answered, but not a Kallichore status
	unread   string // answered, but the answer could not be read (no room)
	replaced error  // not asked: the name no longer held the socket (pin)
}

func tryStatus(ctx context.Context, c *kallichore.Client, s kallichore.Socket) statusTry {
	st, err := c.StatusOf(ctx, s)
	return statusTryOf(st.ProcessID, err)
}

// statusTryOf reads StatusOf's result. Only a try that got no answer is
// silence: gate 3 takes two of those for a dead server.
func statusTryOf(pid int, err error) statusTry {
	if err == nil {
		return statusTry{answered: true, pid: pid}
	}
	switch {
	case kallichore.Answered(err):
		// Something answers, but it is not a Kallichore /status (one
		// is a few hundred bytes).
		return statusTry{answered: true, other: trimErr(err)}
	case errors.Is(err, kallichore.ErrNoRoom):
		// An answer came that could not be held beside the others
		// being read.
		return statusTry{answered: true, unread: trimErr(err)}
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
		case t.replaced != nil:
			// Not silence: nothing was asked.
			return sayUnsure, "/status not asked: the name was " + errReplaced.Error()
		case t.answered && t.other != "":
			return sayUnsure, "something answers /status, but not Kallichore: " + t.other
		case t.answered && t.unread != "":
			return sayUnsure, "/status answered, but the answer was not read: " + t.unread
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

// trimErr drops the "GET /status on <path>:" prefix: the report names
// the path.
func trimErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ".sock: "); i >= 0 {
		return s[i+len(".sock: "):]
	}
	return s
}
