// Package printable keeps what users name (a process's comm, a socket's
// path, a kernel supervisor's session fields) from writing control
// characters into the janitor's text reports: a comm holding a newline
// would forge a report line, an escape sequence would rewrite the
// operator's terminal. JSON output and slog's text lines escape on their
// own.
package printable

import (
	"strconv"
	"unicode/utf8"
)

// Quote returns s unchanged when it is valid UTF-8 and every rune is
// printable, and otherwise as a Go string literal ("kc-\x1b[2J.sock"), so
// the reader sees it was escaped.
func Quote(s string) string {
	if clean(s, false) {
		return s
	}
	return strconv.Quote(s)
}

// Word is Quote for one word of a space-separated list, such as a tree's
// members: a space is escaped too, so one name cannot read as two.
func Word(s string) string {
	if clean(s, true) {
		return s
	}
	return strconv.Quote(s)
}

func clean(s string, word bool) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !strconv.IsPrint(r) || word && r == ' ' {
			return false
		}
		i += n
	}
	return true
}
