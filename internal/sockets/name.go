// Package sockets finds Kallichore supervisor sockets (kc-<pid>.sock,
// kc-<pid>.<x>.sock and the hashed kc-<hex>.sock) in socket directories, on
// the host or inside a container, decides which are orphans, and unlinks
// those safely.
//
// A socket is stale only when three independent gates agree (DESIGN §9):
//
//  1. its owner is not a live supervisor: no process with that PID (in the
//     PID namespace the name was written in), or the PID is a thread ID of
//     another process, or a zombie, or its comm is not in the supervisor
//     set, or it started after the socket file was last changed (a recycled
//     PID);
//  2. no live socket holds it: connect(2) is refused and no socket at all,
//     listening or not, is bound to that path in net/unix of the socket's
//     network namespace (a socket bound and not listening refuses too);
//  3. GET /status is silent twice, a short pause apart. (An answer with a
//     process_id other than the PID in the name is not silence: gate 3 is
//     then unsure, since the name may be a hashed one that reads as a PID.)
//
// Gates that disagree give the verdict "unknown": the socket is kept and
// reported. Session sockets follow their server's control socket.
//
// A hashed name (kc-<hex>.sock, Kallichore's per-session name when the
// usual path would be too long: a u64 hash printed as 1–16 lowercase hex
// digits, unpadded) names no PID, so gate 1 cannot be applied and nothing
// ties it to a server. A hash made only of decimal digits that reads as a
// PID is indistinguishable from a control socket kc-<pid>.sock; it is
// parsed as one, and gate 3 keeps the ambiguity safe: an answer whose
// process_id is not the name's makes the socket unknown, never stale. It is stale only when gates 2 and 3
// both find it dead and its inode changed at least a minimum age ago
// (Config.HashedMinAge): without an owner's start time, the age is a
// second line of defence behind net/unix against calling a fresh socket,
// bound but not yet listening, dead. Anything that listens on it, is
// bound to its path or answers /status makes it live.
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
	KindSession Kind = "session" // kc-<pid>.<x>.sock, or the hashed kc-<hex>.sock
)

// MaxPID is the largest PID Linux can hand out (PID_MAX_LIMIT on 64-bit).
const MaxPID = 1 << 22

// maxSessionTag bounds the <x> in kc-<pid>.<x>.sock. Kallichore uses the
// first 8 characters of the session ID; allow some slack.
const maxSessionTag = 64

// maxHashLen bounds the <hex> in a hashed name kc-<hex>.sock: Kallichore
// prints a u64 hash with {:x}, 1 to 16 digits without padding.
const maxHashLen = 16

// Name is a parsed socket file name.
type Name struct {
	PID     int // 0 for a hashed name
	Kind    Kind
	Session string // the <x> of a session socket
	// Hash is the <hex> of a hashed name, kc-<hex>.sock (Kind is
	// KindSession; PID and Session are empty).
	Hash string
}

// Hashed reports whether n is a hashed name, which names no PID.
func (n Name) Hashed() bool { return n.Hash != "" }

// ParseName parses a socket file name (a single path component). It
// accepts exactly "kc-<pid>.sock", "kc-<pid>.<x>.sock" and "kc-<hex>.sock",
// where <pid> is a decimal PID without leading zeros in 1..MaxPID, <x> is
// 1–64 of [A-Za-z0-9_-] and <hex> is 1–16 lowercase hex digits without a
// leading zero (Kallichore's hashed name for a session socket whose usual
// path would exceed 104 characters). A name that is both — decimal digits
// that read as a PID — is taken as kc-<pid>.sock. Anything else — path
// separators, "..", dots or other characters in <x>, uppercase, padded or
// over-long hex — is rejected.
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
		if !hasTag && validHash(rest) {
			return Name{Kind: KindSession, Hash: rest}, true
		}
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

// validHash accepts what Rust's {:x} prints for a u64: 1–16 lowercase hex
// digits, no leading zero. Anything looser would only widen what the
// sweep may unlink. All-decimal hashes are accepted here; ParseName has
// already taken those that read as a PID for control sockets.
func validHash(s string) bool {
	if s == "" || len(s) > maxHashLen || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'f', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}
