package trees

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/safeunlink"
	"github.com/kc-watchman/kc-watchman/internal/unixdiag"
)

// soAcceptCon is __SO_ACCEPTCON in the Flags column of /proc/net/unix: the
// socket is listening.
const soAcceptCon = 0x10000

// Socket is a kc-*.sock a tree's member listened on, examined before the
// tree was killed.
type Socket struct {
	Path string
	// Owner is the member whose descriptor held the socket.
	Owner int
	File  safeunlink.File
}

// TreeSockets returns the Kallichore sockets the tree's members listen on
// and that may be removed once the tree is dead. The path of a bound socket
// is whatever string the member passed to bind(2), so it is trusted only
// as far as it can be checked: it must be absolute, clean and on one line
// (the kernel prints it unescaped in /proc/net/unix); its name must be
// kc-<pid>.sock or kc-<pid>.<x>.sock for the very member holding it, as
// Kallichore names them; the file found there must be a socket owned by
// the tree's UID; and that file must be the one the member bound. For a
// member sharing the caller's mount namespace whose descriptors the caller
// can read, the socket is matched through /proc/<pid>/fd and the path
// taken as is. For any other member — in a private mount namespace, or
// out of the caller's reach, as the user's own supervisors are to a
// rootless podman's hook, which runs in another user namespace —
// sock_diag names the listening sockets of the caller's network namespace
// and the inode of the file each was bound to, and the path must lead the
// caller to that very inode. Anything else is left alone.
func TreeSockets(root string, t Tree) []Socket {
	if t.UID < 0 {
		return nil
	}
	owner := map[uint64]int{}
	var unseen []int
	for _, m := range t.Members {
		if !sameMountNS(root, m.PID) {
			unseen = append(unseen, m.PID)
			continue
		}
		dir := root + "/" + strconv.Itoa(m.PID) + "/fd"
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
				owner[ino] = m.PID
			}
		}
	}
	seen := map[string]bool{}
	var out []Socket
	if len(unseen) > 0 {
		out = boundSockets(unseen, t.UID, seen)
	}
	if len(owner) == 0 {
		return out
	}
	for _, m := range t.Members {
		for _, e := range readUnixTable(root + "/" + strconv.Itoa(m.PID) + "/net/unix") {
			pid, ok := owner[e.inode]
			if !ok || e.flags&soAcceptCon == 0 || seen[e.path] || !plausiblePath(e.path, pid) {
				continue
			}
			seen[e.path] = true
			f, err := safeunlink.Examine(e.path)
			if err != nil || f.UID != t.UID {
				continue
			}
			out = append(out, Socket{Path: e.path, Owner: pid, File: f})
		}
		if len(out) > 0 || len(seen) > 0 {
			break
		}
	}
	return out
}

// boundSockets returns the listening sockets, named for one of pids, whose
// path leads the caller to the file the socket was bound to, owned by uid.
// sock_diag cannot say which process holds a socket; a name carrying a
// member's PID, a listener bound to exactly the file the caller sees
// there, and RemoveSocket's refused connect before the unlink stand in
// for the descriptor match.
func boundSockets(pids []int, uid int, seen map[string]bool) []Socket {
	listening, err := unixdiag.Listening()
	if err != nil {
		return nil
	}
	var out []Socket
	for _, l := range listening {
		if !l.HasVFS || seen[l.Path] {
			continue
		}
		for _, pid := range pids {
			if !plausiblePath(l.Path, pid) {
				continue
			}
			f, err := safeunlink.Examine(l.Path)
			if err != nil || f.Dev != l.Dev || f.Ino != l.Ino || f.UID != uid {
				break
			}
			seen[l.Path] = true
			out = append(out, Socket{Path: l.Path, Owner: pid, File: f})
			break
		}
	}
	return out
}

// plausiblePath reports whether path is a clean absolute kc-<pid>.sock or
// kc-<pid>.<x>.sock for owner.
func plausiblePath(path string, owner int) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsAny(path, "\n\x00") {
		return false
	}
	name := filepath.Base(path)
	prefix := "kc-" + strconv.Itoa(owner)
	return name == prefix+".sock" ||
		(strings.HasPrefix(name, prefix+".") && strings.HasSuffix(name, ".sock") && len(name) > len(prefix)+len("..sock"))
}

// sameMountNS reports whether pid sees the caller's mount namespace: a path
// a member bound inside a private mount namespace names another file here.
func sameMountNS(root string, pid int) bool {
	theirs, err1 := os.Readlink(root + "/" + strconv.Itoa(pid) + "/ns/mnt")
	ours, err2 := os.Readlink("/proc/self/ns/mnt")
	return err1 == nil && err2 == nil && theirs == ours
}

// ErrStillListening is returned by RemoveSocket when something accepts
// connections on the socket: it is not dead, whoever holds it.
var ErrStillListening = errors.New("something still listens on it")

// RemoveSocket unlinks s once its tree is dead: only if nothing listens on
// it any more (connect is refused) and it is still the examined socket. A
// socket already gone (its server unlinked it on the way out) is what was
// wanted: no error, nothing to warn about.
func RemoveSocket(s Socket) error {
	err := refused(s.Path)
	if err == nil {
		err = safeunlink.Unlink(s.Path, s.File)
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, safeunlink.ErrGone) {
		return nil
	}
	return err
}

// refused connects to path and expects ECONNREFUSED, the answer of a
// socket file whose listener is gone.
func refused(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("probing %s: %w", path, err)
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return nil
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINPROGRESS):
		return fmt.Errorf("%s: %w", path, ErrStillListening)
	}
	return fmt.Errorf("probing %s: %w", path, err)
}

type unixEntry struct {
	flags uint64
	inode uint64
	path  string
}

// readUnixTable parses a /proc/net/unix file:
// "Num RefCount Protocol Flags Type St Inode Path".
func readUnixTable(path string) []unixEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []unixEntry
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || !strings.HasPrefix(fields[7], "/") {
			continue
		}
		flags, err1 := strconv.ParseUint(fields[3], 16, 64)
		ino, err2 := strconv.ParseUint(fields[6], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, unixEntry{flags: flags, inode: ino, path: strings.Join(fields[7:], " ")})
	}
	return out
}
