package sockets

// sock_diag: the listening Unix sockets of the caller's network
// namespace through the kernel's sock_diag netlink interface, with the
// path each was bound to and the inode of the socket file that bind(2)
// created.
//
// kc-hook needs it under rootless podman: it runs as root of podman's user
// namespace, where the user's own supervisors' /proc/<pid>/fd links cannot
// be read (ptrace access across user namespaces is refused), so a tree's
// sockets cannot be found through its descriptors. sock_diag answers
// without any: it needs no privilege and no access to the holder.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Request and answer flags of linux/unix_diag.h (not in x/sys/unix).
const (
	showName = 0x01 // UDIAG_SHOW_NAME
	showVFS  = 0x02 // UDIAG_SHOW_VFS

	attrName = 0 // UNIX_DIAG_NAME
	attrVFS  = 1 // UNIX_DIAG_VFS

	// The sock states a Unix socket reports (TCP_* of linux/tcp_states.h).
	tcpEstablished = 1
	tcpClose       = 7  // unconnected, or bound and not listening
	tcpListen      = 10 // a listening socket

	reqLen = 24 // sizeof(struct unix_diag_req)
	msgLen = 16 // sizeof(struct unix_diag_msg)
)

// DiagSocket is one listening Unix socket bound to a path.
type DiagSocket struct {
	// Inode is the socket's own inode (socket:[N] in /proc/<pid>/fd).
	Inode uint64
	// Path is what the holder passed to bind(2), in its mount namespace.
	Path string
	// Dev and Ino identify the socket file bind(2) created, as stat(2)
	// reports them: the path names that very file to a caller only if a
	// stat of it gives the same pair. HasVFS is false when the kernel
	// gave none.
	Dev, Ino uint64
	HasVFS   bool
}

// ErrUnsupported is returned (wrapped) when the kernel has no Unix socket
// diagnostics (CONFIG_UNIX_DIAG unset).
var ErrUnsupported = errors.New("unix socket diagnostics unavailable")

// DiagListening returns the listening path-bound Unix sockets of the caller's
// network namespace. Abstract and unnamed sockets are left out.
func DiagListening() ([]DiagSocket, error) {
	all, err := diagDump(-1, 1<<tcpListen, showName|showVFS)
	if err != nil {
		return nil, err
	}
	var out []DiagSocket
	for _, s := range all {
		if s.state == tcpListen {
			out = append(out, s.DiagSocket)
		}
	}
	return out, nil
}

// DiagNetUnix is ReadNetUnix of the caller's network namespace from
// sock_diag, which hands each path over with its length: /proc/net/unix
// prints paths raw, so a user who binds a name holding a newline and a
// made-up line after it makes any path look bound, or listening, there.
//
// A dump is no snapshot: it goes on, part after part, from a position in
// a hash bucket, and a socket closed meanwhile ahead of it there makes the
// next one be skipped. A socket missing from the table is the dangerous
// error (it reads as unbound), one too many is not: so the table is the
// union of two dumps, in which a socket open throughout both appears.
//
// Each socket is also filed by the socket file bind(2) made (NetUnix.Held):
// a file reached by another name than the binder's is still known held.
func DiagNetUnix() (NetUnix, error) { return diagNetUnix(-1) }

// DiagNetUnixIn is DiagNetUnix of the network namespace ns (an open
// /proc/<pid>/ns/net): its sock_diag socket is made there, by a thread
// that enters the namespace for that alone, and asked from here. A
// container's /proc/<pid>/net/unix knows no socket files, only paths.
func DiagNetUnixIn(ns *os.File) (NetUnix, error) {
	n, err := diagNetUnix(int(ns.Fd()))
	runtime.KeepAlive(ns)
	return n, err
}

func diagNetUnix(ns int) (NetUnix, error) {
	n := NetUnix{}
	seen := map[uint64]bool{} // by inode: see ReadNetUnix
	for range 2 {
		all, err := diagDump(ns, ^uint32(0), showName|showVFS)
		if err != nil {
			return nil, err
		}
		for _, s := range all {
			if seen[s.Inode] {
				continue
			}
			seen[s.Inode] = true
			u := UnixSocket{Inode: s.Inode, Listening: s.state == tcpListen}
			// net/unix's St is the socket's state, sock_diag's the sock's.
			switch s.state {
			case tcpClose:
				u.State = 1 // unconnected
			case tcpEstablished:
				u.State = 3 // connected
			}
			n[s.Path] = append(n[s.Path], u)
			if s.HasVFS {
				k := fileKey(s.Dev, s.Ino)
				n[k] = append(n[k], u)
			}
		}
	}
	return n, nil
}

// diagSocket is a DiagSocket in any state.
type diagSocket struct {
	DiagSocket
	state uint8
}

// diagDump asks sock_diag for the path-bound Unix sockets of the network
// namespace ns (an open descriptor; -1: the caller's) in the given states
// (a mask of 1<<state).
func diagDump(ns int, states, show uint32) ([]diagSocket, error) {
	fd, err := diagSocketIn(ns)
	if err != nil {
		return nil, fmt.Errorf("opening a sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	// The kernel answers at once; a wait is bounded all the same.
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	if err := unix.Sendto(fd, diagRequest(states, show), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("asking sock_diag for Unix sockets: %w", err)
	}
	buf := make([]byte, 64<<10)
	var out []diagSocket
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("reading sock_diag's answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parsing sock_diag's answer: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				// The dump's own error, if any, ends it.
				if len(m.Data) >= 4 {
					if errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4]))); errno != 0 {
						return nil, fmt.Errorf("sock_diag: %w", errno)
					}
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4])))
					if errno == 0 {
						continue
					}
					if errno == unix.ENOENT || errno == unix.EOPNOTSUPP {
						return nil, fmt.Errorf("%w: %w", ErrUnsupported, errno)
					}
					return nil, fmt.Errorf("sock_diag: %w", errno)
				}
				return nil, errors.New("sock_diag: truncated error message")
			case unix.SOCK_DIAG_BY_FAMILY:
				if s, ok := parseDiag(m.Data); ok {
					if len(out) >= maxNetUnix {
						return nil, fmt.Errorf("sock_diag: %w: over %d sockets", errNetUnixTooLarge, maxNetUnix)
					}
					out = append(out, s)
				}
			}
		}
	}
}

// diagSocketIn opens a sock_diag socket in the network namespace ns (-1:
// ours). A netlink socket answers for the namespace it was made in, so a
// locked thread enters ns, makes it, and comes back; a thread that could
// not come back is never unlocked, and Go ends it with its goroutine.
func diagSocketIn(ns int) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	}
	if ns < 0 {
		return open()
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		ours, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("our network namespace: %w", err)}
			return
		}
		defer unix.Close(ours)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("entering the network namespace: %w", err)}
			return
		}
		fd, err := open()
		if back := unix.Setns(ours, unix.CLONE_NEWNET); back != nil {
			if err == nil {
				unix.Close(fd)
			}
			done <- result{-1, fmt.Errorf("leaving the network namespace: %w", back)}
			return // still locked: the thread ends here
		}
		runtime.UnlockOSThread()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

func diagRequest(states, show uint32) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], 1)                    // sequence
	ne.PutUint32(b[12:], uint32(os.Getpid())) // port
	r := b[unix.NLMSG_HDRLEN:]
	r[0] = unix.AF_UNIX
	ne.PutUint32(r[4:], states)
	ne.PutUint32(r[12:], show)
	return b
}

// parseDiag reads one unix_diag_msg and its attributes; ok is false for
// a socket bound to no path.
func parseDiag(data []byte) (diagSocket, bool) {
	if len(data) < msgLen || data[0] != unix.AF_UNIX {
		return diagSocket{}, false
	}
	ne := binary.NativeEndian
	s := diagSocket{DiagSocket: DiagSocket{Inode: uint64(ne.Uint32(data[4:]))}, state: data[2]}
	attrs := data[msgLen:]
	for len(attrs) >= 4 {
		l := int(ne.Uint16(attrs[0:]))
		typ := ne.Uint16(attrs[2:])
		if l < 4 || l > len(attrs) {
			break
		}
		val := attrs[4:l]
		switch typ {
		case attrName:
			// bind(2)'s address, with its terminating NUL when it has
			// one; an abstract name starts with a NUL.
			for len(val) > 0 && val[len(val)-1] == 0 {
				val = val[:len(val)-1]
			}
			if len(val) > 0 && val[0] != 0 {
				s.Path = string(val)
			}
		case attrVFS:
			if len(val) >= 8 {
				s.Ino = uint64(ne.Uint32(val[0:]))
				// The kernel's dev_t (major << 20 | minor), not the
				// encoding stat(2) returns.
				kdev := ne.Uint32(val[4:])
				s.Dev = unix.Mkdev(kdev>>20, kdev&(1<<20-1))
				s.HasVFS = true
			}
		}
		attrs = attrs[min(len(attrs), (l+3)&^3):]
	}
	return s, s.Path != ""
}
