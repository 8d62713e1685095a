package pgkill

import (
	"syscall"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// WithJoinerSeams returns o with the test seams of the search for joiners
// set (nil leaves one unset). Kill runs them on its own goroutine.
func WithJoinerSeams(o Options, before func(round int), found func(round int, found []fingerprint.Stat)) Options {
	o.seams = joinerSeams{beforeScan: before, found: found}
	return o
}

// WithSearchSeam returns o with f run whenever Kill searches /proc for a
// group's joiners.
func WithSearchSeam(o Options, f func(round int)) Options {
	o.seams.searched = f
	return o
}

// SignalWhilePinned exposes the stop, re-check, signal, continue step.
func SignalWhilePinned(root string, pgid int, pin *fingerprint.Pinned, sig syscall.Signal) error {
	return signalWhilePinned(root, pgid, pin, sig, func() error { return nil }, -1)
}

func SignalAs(pgid int, sig syscall.Signal, uid int) (int, error) { return signalAs(pgid, sig, uid) }
