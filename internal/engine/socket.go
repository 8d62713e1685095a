package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrSocketPath marks an endpoint that cannot name a unix socket: a usage
// error.
var ErrSocketPath = errors.New("not a unix socket path")

// SocketPath reads a gRPC engine's endpoint (containerd's address, a CRI
// socket): an absolute path, optionally written unix:///path as the
// kubelet and containerd spell it. It does not look at the file system.
func SocketPath(ep string) (string, error) {
	p := ep
	if rest, ok := strings.CutPrefix(p, "unix://"); ok {
		p = rest
	} else if i := strings.Index(p, "://"); i >= 0 {
		return "", fmt.Errorf("%w %q: scheme %q not supported (a unix socket path)", ErrSocketPath, ep, p[:i])
	}
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w %q: not an absolute socket path", ErrSocketPath, ep)
	}
	return filepath.Clean(p), nil
}

// Existing are those of paths that exist (a symlink too: asking it
// refuses it, loudly, rather than auto quietly skipping it) and that the
// caller may connect to. For root that is every one; an ordinary user is
// refused by root's Docker or containerd socket unless its group lets him
// in, and their answers could not vouch for his trees anyway (only his
// own podman's can): found, they would make every run of his exit 3.
func Existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		// access(2) checks the real IDs, which are the janitor's: it is
		// not setuid.
		if os.Geteuid() != 0 && unix.Access(p, unix.W_OK) != nil {
			continue
		}
		out = append(out, p)
	}
	return out
}

// FirstExisting is the first of paths that exists.
func FirstExisting(paths []string) (string, bool) {
	if e := Existing(paths); len(e) > 0 {
		return e[0], true
	}
	return "", false
}

// ReadySignal is for an engine whose stream says when it is in place:
// close the returned channel then, and w.Ready is called (once, from its
// own goroutine). done must be called when the stream ends, accepted or
// not. With no w.Ready the channel is nil.
func (w DeathWatch) ReadySignal() (ready chan struct{}, done func()) {
	if w.Ready == nil {
		return nil, func() {}
	}
	ready = make(chan struct{})
	stop := make(chan struct{})
	go func() {
		select {
		case <-ready:
			w.Ready()
		case <-stop: // refused before it was in place
		}
	}()
	return ready, func() { close(stop) }
}
