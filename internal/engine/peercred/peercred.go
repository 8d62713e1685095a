// Package peercred connects to a container engine's unix socket and tells
// who answered: the UID of the process on the other end of that very
// connection (SO_PEERCRED), not the owner of whatever file the path names
// a moment later. A user who controls a socket's directory can swap the
// path between a query and a stat of it; the peer of a connection cannot
// be swapped (DESIGN "Ground truth must be corroborated").
package peercred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrSymlink is returned for a socket path whose last component is a
// symlink: an engine endpoint is named by its real path.
var ErrSymlink = errors.New("is a symlink; give the socket's real path")

// UIDUnknown stands for a peer whose UID is not known: no connection was
// made, its credentials could not be read, or it is not a unix socket.
const UIDUnknown = -1

// DialError is a unix socket that could not be connected to. It names
// the socket's own path, never the /proc/self/fd path dialled, and says
// the cause in words.
type DialError struct {
	// What the socket is ("podman's API socket"); "socket" when unsaid.
	What string
	Path string
	Err  error
}

func (e *DialError) Error() string {
	what := e.What
	if what == "" {
		what = "socket"
	}
	return fmt.Sprintf("cannot connect to %s %s: %s", what, e.Path, Cause(e.Err))
}

func (e *DialError) Unwrap() error { return e.Err }

// Cause words why a connection to a unix socket failed: the errno's own
// words, with what to do where that is clear.
func Cause(err error) string {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err.Error()
	}
	switch errno {
	case unix.EACCES, unix.EPERM:
		return "permission denied (run as root or as the socket's owner)"
	case unix.ECONNREFUSED:
		return "connection refused (nothing listens on it: is the service running?)"
	case unix.ENOENT:
		return "no such file or directory (is the service running, and is this its socket?)"
	}
	return errno.Error()
}

// DialUnix connects to the unix socket at path. The path's last component
// is opened with O_PATH|O_NOFOLLOW and checked to be a socket, and the
// connection is made through that descriptor (/proc/self/fd/N), so the
// file checked is the file connected to. It returns the connection and the
// peer's UID. A failure to connect is a *DialError.
func DialUnix(ctx context.Context, path string) (net.Conn, int, error) {
	return DialUnixAs(ctx, "", path)
}

// DialUnixAs is DialUnix for a socket an error calls what ("podman's API
// socket").
func DialUnixAs(ctx context.Context, what, path string) (net.Conn, int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, UIDUnknown, &DialError{What: what, Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, UIDUnknown, fmt.Errorf("%s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return nil, UIDUnknown, fmt.Errorf("%s %w", path, ErrSymlink)
	default:
		return nil, UIDUnknown, fmt.Errorf("%s: not a socket", path)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		// The dialler's own error names the /proc/self/fd path: an
		// operator knows the socket by its own.
		var errno unix.Errno
		if errors.As(err, &errno) {
			err = errno
		}
		return nil, UIDUnknown, &DialError{What: what, Path: path, Err: err}
	}
	uid, err := PeerUID(c)
	if err != nil {
		c.Close()
		return nil, UIDUnknown, fmt.Errorf("%s: %w", path, err)
	}
	return c, uid, nil
}

// PeerUID returns the UID of the process that owns the other end of a
// unix connection, as the kernel recorded it when the peer listened.
func PeerUID(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return UIDUnknown, fmt.Errorf("not a unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return UIDUnknown, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return UIDUnknown, err
	}
	if gerr != nil {
		return UIDUnknown, fmt.Errorf("SO_PEERCRED: %w", gerr)
	}
	return int(cred.Uid), nil
}

// Transport is an http.Transport for one unix socket that remembers the
// peer UID of every connection it made. UID reports the one UID that
// answered; connections to peers of different UIDs (the path was swapped
// between two of them) make it unknown.
type Transport struct {
	*http.Transport
	mu   sync.Mutex
	uids map[int]bool
}

// NewTransport returns a Transport dialling path (whatever address the
// request names).
func NewTransport(path string) *Transport { return NewTransportAs("", path) }

// NewTransportAs is NewTransport for a socket an error calls what.
func NewTransportAs(what, path string) *Transport {
	t := &Transport{uids: map[int]bool{}}
	t.Transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, uid, err := DialUnixAs(ctx, what, path)
			if err != nil {
				return nil, err
			}
			t.mu.Lock()
			t.uids[uid] = true
			t.mu.Unlock()
			return c, nil
		},
		DisableCompression: true,
		MaxIdleConns:       1,
	}
	return t
}

// UID is the peer UID of every connection made so far, or an error if
// there was none or they differ.
func (t *Transport) UID() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch len(t.uids) {
	case 0:
		return UIDUnknown, errors.New("no connection was made")
	case 1:
		for u := range t.uids {
			return u, nil
		}
	}
	return UIDUnknown, fmt.Errorf("the socket answered as %d different UIDs (was its path swapped?)", len(t.uids))
}
