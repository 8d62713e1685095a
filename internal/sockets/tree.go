package sockets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
)

// TreeSocket is a kc-*.sock a supervisor tree's member listened on,
// examined before the tree was killed.
type TreeSocket struct {
	Path string
	// Owner is the member whose descriptor held the socket.
	Owner int
	File  File
}

// TreeSockets returns the Kallichore sockets that members (the PIDs of one
// tree, all owned by uid; a negative uid is a tree of mixed owners) listen
// on and that may be removed once the tree is dead. The path of a bound
// socket is whatever string the member passed to bind(2), so it is trusted
// only as far as it can be checked: it must be absolute, clean and on one
// line (the kernel prints it unescaped in /proc/net/unix); its name must
// parse (ParseName) as kc-<pid>.sock or kc-<pid>.<x>.sock for the very
// member holding it, as Kallichore names them; the file found there must
// be a socket owned by uid; and that file must be the one the member
// bound. For a member sharing the caller's mount namespace whose
// descriptors the caller can read, the socket is matched through
// /proc/<pid>/fd and the path taken as is. For any other member — in a
// private mount namespace, or out of the caller's reach, as the user's own
// supervisors are to a rootless podman's hook, which runs in another user
// namespace — sock_diag names the listening sockets of the caller's
// network namespace and the inode of the file each was bound to, and the
// path must lead the caller to that very inode. Anything else is left
// alone. The tables read are sh's where it is not nil.
func TreeSockets(procRoot string, uid int, members []int, sh *Shared) []TreeSocket {
	if uid < 0 {
		return nil
	}
	rc := &reacher{sh: sh}
	defer rc.close()
	owner := map[uint64]int{}
	var unseen []int
	for _, pid := range members {
		if !pathwalk.SameMountNS(procRoot, pid) {
			unseen = append(unseen, pid)
			continue
		}
		dir := procRoot + "/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			link, err := os.Readlink(dir + "/" + e.Name())
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if ino, err := strconv.ParseUint(strings.TrimSuffix(link[len("socket:["):], "]"), 10, 64); err == nil {
				owner[ino] = pid
			}
		}
	}
	seen := map[string]bool{}
	var out []TreeSocket
	if len(unseen) > 0 {
		out = boundSockets(rc, unseen, uid, seen)
	}
	if len(owner) == 0 {
		return out
	}
	for _, m := range members {
		// An unreadable or unknown table is no evidence: try the next
		// member's (all members normally share one network namespace).
		nu, _ := sh.netUnix(procRoot, m)
		out = heldSockets(rc, nu, owner, uid, seen, out)
		if len(out) > 0 || len(seen) > 0 {
			break
		}
	}
	return out
}

// heldSockets adds to out the sockets of nu a member of owner listens on,
// found as TreeSockets says.
func heldSockets(rc *reacher, nu NetUnix, owner map[uint64]int, uid int, seen map[string]bool, out []TreeSocket) []TreeSocket {
	var r *reach
	for path, socks := range nu {
		pid := heldListening(socks, owner)
		if pid == 0 || seen[path] || !plausiblePath(path, pid) {
			continue
		}
		seen[path] = true
		if r == nil {
			var done func()
			r, done = rc.get()
			defer done()
		}
		f, err := r.examine(path)
		if err != nil || f.UID != uid {
			continue
		}
		out = append(out, TreeSocket{Path: path, Owner: pid, File: f})
	}
	return out
}

// heldListening returns the member whose descriptor holds a listening
// socket among socks (all bound to one path), or 0.
func heldListening(socks []UnixSocket, owner map[uint64]int) int {
	for _, s := range socks {
		if pid, ok := owner[s.Inode]; ok && s.Listening {
			return pid
		}
	}
	return 0
}

// boundSockets returns the listening sockets, named for one of pids, whose
// path leads the caller to the file the socket was bound to, owned by uid.
// sock_diag cannot say which process holds a socket; a name carrying a
// member's PID, a listener bound to exactly the file the caller sees
// there, and RemoveTreeSockets' refused connect before the unlink stand in
// for the descriptor match.
func boundSockets(rc *reacher, pids []int, uid int, seen map[string]bool) []TreeSocket {
	listening, err := DiagListening()
	if err != nil {
		return nil
	}
	r, done := rc.get()
	defer done()
	var out []TreeSocket
	for _, l := range listening {
		if !l.HasVFS || seen[l.Path] {
			continue
		}
		for _, pid := range pids {
			if !plausiblePath(l.Path, pid) {
				continue
			}
			f, err := r.examine(l.Path)
			if err != nil || f.Dev != l.Dev || f.Ino != l.Ino || f.UID != uid {
				break
			}
			seen[l.Path] = true
			out = append(out, TreeSocket{Path: l.Path, Owner: pid, File: f})
			break
		}
	}
	return out
}

// plausiblePath reports whether path is a clean absolute path on one line
// whose name is kc-<owner>.sock or kc-<owner>.<x>.sock, by ParseName's
// rules: the same names sweep accepts, no looser.
func plausiblePath(path string, owner int) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsAny(path, "\n\x00") {
		return false
	}
	n, ok := ParseName(filepath.Base(path))
	return ok && !n.Hashed() && n.PID == owner
}

// ErrStillListening is returned by RemoveTreeSockets when something accepts
// connections on the socket: it is not dead, whoever holds it.
var ErrStillListening = errors.New("something still listens on it")

// RemoveTreeSockets unlinks the sockets of a tree once it is dead, and
// returns what became of each, in order: nil when it is gone. One is
// unlinked only if nothing listens on it any more (connect is refused)
// and it is still the examined socket; one already gone (its server
// unlinked it on the way out) is what was wanted, and no error. Their
// directories are reached as Examine reaches them, judged by one read of
// the mount table (sh's, where it is not nil), and each socket dialled
// through a descriptor (PinAt), so that neither the walk nor the connect
// waits on a user's FUSE server.
func RemoveTreeSockets(socks []TreeSocket, sh *Shared) []error {
	errs := make([]error, len(socks))
	if len(socks) == 0 {
		return errs
	}
	rc := &reacher{sh: sh}
	defer rc.close()
	r, done := rc.get()
	defer done()
	for i, s := range socks {
		err := r.within(s.Path, func(dfd int, name string) error {
			if err := refused(dfd, name); err != nil {
				return err
			}
			return unlinkAt(dfd, name, s.File)
		})
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, ErrGone) {
			errs[i] = err
		}
	}
	return errs
}

// refused connects to name in the directory open as dirfd and expects
// ECONNREFUSED, the answer of a socket file whose listener is gone.
func refused(dirfd int, name string) error {
	p, err := PinAt(dirfd, name)
	if err != nil {
		return err
	}
	defer p.Release()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("probing: %w", err)
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: p.Path})
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return nil
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINPROGRESS):
		return ErrStillListening
	}
	// Not wrapped: no answer of connect's says the socket is gone (the
	// name was held), and ENOENT would pass for it.
	return fmt.Errorf("probing: %v", err)
}
