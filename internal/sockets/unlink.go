package sockets

import (
	"errors"
	"fmt"

	"github.com/kc-watchman/kc-watchman/internal/safeunlink"
)

// FileID is what a socket file was when it was classified.
type FileID struct {
	Dev, Ino uint64
	UID      int
	// CtimeSec and CtimeNsec tell apart a socket bound again under a
	// reused inode number; zero skips that check.
	CtimeSec, CtimeNsec int64
}

var (
	// ErrChanged is returned (wrapped) by UnlinkAt when the entry is no
	// longer the socket that was classified: another file type, another
	// inode or another owner. Nothing is unlinked.
	ErrChanged = safeunlink.ErrChanged
	// ErrGone is returned (wrapped) by UnlinkAt when the entry no longer
	// exists.
	ErrGone = safeunlink.ErrGone
	// ErrBadName is returned (wrapped) by UnlinkAt for a name that is not
	// a supervisor socket name (see ParseName).
	ErrBadName = errors.New("not a supervisor socket name")
)

// UnlinkAt removes name from the directory open as dirfd if it is a
// supervisor socket name and still the socket classified as want; see
// safeunlink.UnlinkAt for the checks.
func UnlinkAt(dirfd int, name string, want FileID) error {
	if _, ok := ParseName(name); !ok {
		return fmt.Errorf("%q: %w", name, ErrBadName)
	}
	return safeunlink.UnlinkAt(dirfd, name, safeunlink.File(want))
}
