// Package sockets holds the facts about Kallichore supervisor sockets that
// every caller shares: their names (kc-<pid>.sock, kc-<pid>.<x>.sock and
// the hashed kc-<hex>.sock: ParseName), the one parser of /proc/net/unix
// (ReadNetUnix), the sockets one supervisor tree listens on and their
// removal once it is dead (TreeSockets, RemoveTreeSockets: kc-hook and
// reconcile, through internal/reap), the listening sockets sock_diag names
// (DiagListening, for the rootless hook), and the one unlink primitive:
// Examine, then Unlink or, relative to an open directory, UnlinkAt, which
// never remove anything but the socket that was examined.
//
// It must stay small: kc-hook links it, and kc-hook is budgeted for
// latency (docs/PERFORMANCE.md). The janitor's stale-socket sweep, with
// its /status probe over HTTP, lives in internal/sweep; a test in
// cmd/kc-hook fails if the hook links net/http again.
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
