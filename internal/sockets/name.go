// Package sockets finds Kallichore supervisor sockets (kc-<pid>.sock and
// kc-<pid>.<x>.sock) in socket directories, on the host or inside a
// container, decides which are orphans, and unlinks those safely.
//
// A socket is stale only when three independent gates agree (DESIGN §9):
//
//  1. its owner is not a live supervisor: no process with that PID (in the
//     PID namespace the name was written in), or the PID is a thread ID of
//     another process, or a zombie, or its comm is not in the supervisor
//     set, or it started after the socket file was last changed (a recycled
//     PID);
//  2. nothing listens on it: connect(2) is refused (or, when connect gives
//     no clear answer, no listener with that path in net/unix of the
//     socket's network namespace);
//  3. GET /status is silent twice, a short pause apart, or answers with a
//     process_id other than the PID in the name.
//
// Gates that disagree give the verdict "unknown": the socket is kept and
// reported. Session sockets follow their server's control socket.
//
// Unlinking happens relative to an open directory descriptor, never
// following symlinks, and only if the entry is still a socket with the
// same device, inode and owner as when it was classified (UnlinkAt).
package sockets

import (
	"strconv"
	"strings"
)

// Kind tells a control socket from a per-session socket.
type Kind string

// Socket kinds.
const (
	KindControl Kind = "control" // kc-<pid>.sock
	KindSession Kind = "session" // kc-<pid>.<x>.sock
)

// MaxPID is the largest PID Linux can hand out (PID_MAX_LIMIT on 64-bit).
const MaxPID = 1 << 22

// maxSessionTag bounds the <x> in kc-<pid>.<x>.sock. Kallichore uses the
// first 8 characters of the session ID; allow some slack.
const maxSessionTag = 64

// Name is a parsed socket file name.
type Name struct {
	PID     int
	Kind    Kind
	Session string // the <x> of a session socket
}

// ParseName parses a socket file name (a single path component). It
// accepts exactly "kc-<pid>.sock" and "kc-<pid>.<x>.sock", where <pid> is a
// decimal PID without leading zeros in 1..MaxPID and <x> is 1–64 of
// [A-Za-z0-9_-]. Anything else — path separators, "..", dots or other
// characters in <x>, Kallichore's hashed long-path names
// (kc-<hex hash>.sock, which name no PID) — is rejected.
func ParseName(name string) (Name, bool) {
	rest, ok := strings.CutPrefix(name, "kc-")
	if !ok {
		return Name{}, false
	}
	rest, ok = strings.CutSuffix(rest, ".sock")
	if !ok {
		return Name{}, false
	}
	pidStr, tag, hasTag := strings.Cut(rest, ".")
	pid, ok := parsePID(pidStr)
	if !ok {
		return Name{}, false
	}
	if !hasTag {
		return Name{PID: pid, Kind: KindControl}, true
	}
	if !validTag(tag) {
		return Name{}, false
	}
	return Name{PID: pid, Kind: KindSession, Session: tag}, true
}

func parsePID(s string) (int, bool) {
	if s == "" || len(s) > 7 || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	pid, err := strconv.Atoi(s)
	if err != nil || pid < 1 || pid > MaxPID {
		return 0, false
	}
	return pid, true
}

func validTag(s string) bool {
	if s == "" || len(s) > maxSessionTag {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
