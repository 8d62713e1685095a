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
// Kallichore names them; the member must share the caller's mount
// namespace; and the file found there must be a socket owned by the
// tree's UID. Anything else is left alone.
func TreeSockets(root string, t Tree) []Socket {
	if t.UID < 0 {
		return nil
	}
	owner := map[uint64]int{}
	for _, m := range t.Members {
		if !sameMountNS(root, m.PID) {
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
	if len(owner) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var out []Socket
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
