package sweep

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

// PathPinner pins sockets an operator named by path (cull --socket); a
// socket a sweep found is pinned through the directory the sweep opened
// instead (Socket.Pin). The way to the socket is walked as the sweep
// walks a directory it was given: through symlinks, one component at a
// time, none entered before its mount is judged against the mount table,
// so a user's FUSE mount put anywhere on it does not hold the caller. A
// path the sweep reports for a container's socket, /proc/<pid>/root/...,
// is walked inside that container's root, against its own mount table.
// Safe for concurrent use.
type PathPinner struct {
	procRoot string
	mu       sync.Mutex
	guards   map[int]pathwalk.Guard // by target InitPID; 0: the host
}

// NewPathPinner returns a PathPinner whose mount tables are read at first
// use, from procRoot (default /proc); Close releases them.
func NewPathPinner(procRoot string) *PathPinner {
	if procRoot == "" {
		procRoot = "/proc"
	}
	return &PathPinner{procRoot: procRoot, guards: map[int]pathwalk.Guard{}}
}

// Close releases the mount tables read.
func (pp *PathPinner) Close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, g := range pp.guards {
		g.Close()
	}
	clear(pp.guards)
}

// containerPath is a socket path as the sweep reports a container's.
// Compiled when first used, not at every start of the janitor.
var containerPath = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^/proc/([1-9][0-9]*)/root(/.*)$`)
})

// Pin pins the socket at path; its last component is not followed (a
// symlink is not a socket: sockets.ErrNotSocket). An abstract address
// (@name) has no file and is returned as it is.
func (pp *PathPinner) Pin(path string) (sockets.Pinned, error) {
	if strings.HasPrefix(path, "@") {
		return sockets.Pinned{Path: path}, nil
	}
	var p sockets.Pinned
	err := pp.in(path, func(dfd int, name string) (err error) {
		p, err = sockets.PinAt(dfd, name)
		return err
	})
	return p, err
}

// Lstat stats the file at path, not following a last symlink, reached as
// Pin reaches it; for what is mounted over the name, the mount's root.
func (pp *PathPinner) Lstat(path string) (pathwalk.Stat, error) {
	var st pathwalk.Stat
	err := pp.in(path, func(dfd int, name string) (err error) {
		st, err = pathwalk.Lstat(dfd, name)
		return err
	})
	return st, err
}

// in calls f with path's directory, walked there, and its last
// component.
func (pp *PathPinner) in(path string, f func(dfd int, name string) error) error {
	// Not cleaned: ".." after a symlink is the parent of where it led,
	// as connect(2) resolves it, and the walk goes there (after a /proc
	// link, back to where the link is: the walk does not leave the way it
	// came).
	abs := path
	if !filepath.IsAbs(path) {
		wd, err := unix.Getwd() // getcwd(2): no lookup, unlike os.Getwd's stat of $PWD
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		abs = wd + "/" + path
	}
	var t Target
	inner, base := abs, "/"
	if m := containerPath().FindStringSubmatch(abs); m != nil {
		if pid, err := strconv.Atoi(m[1]); err == nil {
			t = Target{InitPID: pid}
			inner, base = m[2], filepath.Join(pp.procRoot, m[1], "root")
		}
	}
	dir, name := filepath.Split(inner)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%s: %w", path, sockets.ErrNotSocket)
	}
	// The guard's table is read once per namespace, then read again in
	// place when it changed (pathwalk.Guard.Mount), which is not safe
	// concurrently; the walk asks no server, so holding the lock through
	// it is cheap.
	pp.mu.Lock()
	defer pp.mu.Unlock()
	g, ok := pp.guards[t.InitPID]
	if !ok {
		g = pathwalk.ReadGuard(pp.procRoot, t.InitPID)
		pp.guards[t.InitPID] = g
	}
	if err := g.Refuse(inner); err != nil {
		return err
	}
	w := pathwalk.Walk{Guard: g, Follow: true, FollowLast: true}
	if t.Container() {
		w.InRoot, w.Prefix = true, base
	}
	dfd, err := w.OpenFrom(base, dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := f(dfd, name); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
