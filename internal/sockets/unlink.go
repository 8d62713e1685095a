package sockets

import (
	"errors"
	"fmt"
)

// ErrBadName is returned (wrapped) by UnlinkAt for a name that is not a
// supervisor socket name (see ParseName).
var ErrBadName = errors.New("not a supervisor socket name")

// UnlinkAt removes name from the directory open as dirfd if it is a
// supervisor socket name and still the socket classified as want; see
// unlinkAt for the checks.
func UnlinkAt(dirfd int, name string, want File) error {
	if _, ok := ParseName(name); !ok {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	return unlinkAt(dirfd, name, want)
}
