package sockets

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// soAcceptCon is __SO_ACCEPTCON in /proc/net/unix's Flags: a listener.
const soAcceptCon = 1 << 16

// UnixSocket is one socket in /proc/net/unix that carries a path.
type UnixSocket struct {
	Inode     uint64 // in sockfs: not the inode of the file at the path
	State     uint8  // St: 1 unconnected, 2 connecting, 3 connected, 4 disconnecting
	Listening bool
}

// fileKey is where a NetUnix from sock_diag also files the sockets bound
// to one socket file, by the file's device and inode: a path is what the
// binder passed to bind(2), relative or through a symlink, and need not be
// the one a sweep reaches the file by. A path never holds a NUL. The
// kernel gives 32 bits of the inode number; more than one file sharing
// them only adds holders, the safe error.
func fileKey(dev, ino uint64) string {
	return "\x00" + strconv.FormatUint(dev, 10) + ":" + strconv.FormatUint(ino&0xffffffff, 10)
}

// Held returns the sockets bound to the socket file f, found at path p:
// those listed under p and, where the table knows the files (sock_diag),
// those bound to f by any other name.
func (n NetUnix) Held(p string, f File) []UnixSocket {
	out := n[p]
	if f.Ino == 0 {
		return out
	}
	for _, u := range n[fileKey(f.Dev, f.Ino)] {
		if !slices.ContainsFunc(out, func(o UnixSocket) bool { return o.Inode == u.Inode }) {
			out = append(slices.Clip(out), u)
		}
	}
	return out
}

// NetUnix is every Unix socket bound to a path in one network namespace,
// in any state, by that path as the binding process gave it to bind(2),
// from its /proc/<pid>/net/unix. nil means the table could not be read.
//
// A path listed here is held by a live socket even when the socket does
// not listen: bound and not yet listening, a client bound to the name, or
// a connection accepted on it (the kernel lists those under their
// listener's path). The socket may even belong to a file that was since
// unlinked and replaced; the path is held all the same.
type NetUnix map[string][]UnixSocket

// Listening reports whether one of socks listens.
func Listening(socks []UnixSocket) bool {
	for _, s := range socks {
		if s.Listening {
			return true
		}
	}
	return false
}

// Holders describes socks for a reason, e.g. "socket inode 4711
// (unconnected)".
func Holders(socks []UnixSocket) string {
	const most = 3
	var parts []string
	for i, s := range socks {
		if i == most {
			parts = append(parts, fmt.Sprintf("%d more", len(socks)-most))
			break
		}
		parts = append(parts, fmt.Sprintf("socket inode %d (%s)", s.Inode, stateName(s)))
	}
	return strings.Join(parts, ", ")
}

func stateName(s UnixSocket) string {
	if s.Listening {
		return "listening"
	}
	switch s.State {
	case 1:
		return "unconnected"
	case 2:
		return "connecting"
	case 3:
		return "connected"
	case 4:
		return "disconnecting"
	}
	return fmt.Sprintf("state %02x", s.State)
}

// ReadNetUnix reads the Unix socket table of the network namespace of pid
// (0: our own). Like a sock_diag dump (DiagNetUnix), a read is no
// snapshot: the kernel goes on from a position in a hash bucket at each
// read(2), and a socket closed meanwhile ahead of it makes the next one
// be skipped. A socket missing reads as unbound, the dangerous error, so
// the table is the union of two reads.
func ReadNetUnix(procRoot string, pid int) (NetUnix, error) {
	p := procRoot + "/self/net/unix"
	if pid > 0 {
		p = procRoot + "/" + strconv.Itoa(pid) + "/net/unix"
	}
	var out NetUnix
	seen := map[uint64]bool{}
	for range 2 {
		n, err := readNetUnixOnce(p)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = n
			for _, socks := range n {
				for _, u := range socks {
					seen[u.Inode] = true
				}
			}
			continue
		}
		// By inode, never by comparing lists: the kernel lists every
		// accepted connection under its listener's path, and a user's
		// 100,000 of them under one path made a pairwise merge take
		// seconds of a poststop's deadline.
		for path, socks := range n {
			for _, u := range socks {
				if !seen[u.Inode] {
					seen[u.Inode] = true
					out[path] = append(out[path], u)
				}
			}
		}
	}
	return out, nil
}

// maxNetUnix bounds the sockets a table may list: a larger one is no
// evidence (nil: "cannot tell"), not a cost any user can impose on root's
// runs. A busy host has tens of thousands.
const maxNetUnix = 1 << 20

// errNetUnixTooLarge is returned (wrapped) for a table over maxNetUnix.
var errNetUnixTooLarge = errors.New("unix socket table too large")

func readNetUnixOnce(p string) (NetUnix, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := parseNetUnix(f, maxNetUnix)
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
func parseNetUnix(r io.Reader, most int) (NetUnix, error) {
	out := NetUnix{}
	entries := 0
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
		if entries++; entries > most {
			return nil, fmt.Errorf("%w: over %d sockets", errNetUnixTooLarge, most)
		}
		out[path] = append(out[path], UnixSocket{Inode: inode, State: uint8(state), Listening: flags&soAcceptCon != 0})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
