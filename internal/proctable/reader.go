package proctable

import (
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// Reader reads the files of /proc/<pid>/ with one openat(2) (relative to a
// descriptor of the procfs root), one read(2) and one close(2) each, into
// a buffer it reuses. An os.File, which package fingerprint's Dir reads
// through, makes about three times as many system calls per file (fstat,
// fcntl, an epoll registration that procfs refuses, a read to see EOF),
// and allocates a buffer each time; on a host with tens of thousands of
// processes those calls are most of a scan's time.
//
// It is a fingerprint.Files: the parsers, the checks and the error classes
// (ErrNotFound for a process that is gone, ErrNotProcess for a thread ID,
// ErrMalformed for unparsable data) are package fingerprint's, so the
// scan's decisions do not depend on which reader it used;
// TestFastScanMatchesFullScan and TestProcReaderMatchesFingerprint check
// that.
type Reader struct {
	root  string
	dirfd int // -1 when root could not be opened: paths are used instead
	buf   []byte
	name  []byte
}

// NewReader reads root. A root that cannot be opened is read by path,
// each file then failing as it would.
func NewReader(root string) *Reader {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	return &Reader{root: root, dirfd: fd, buf: make([]byte, 4096), name: make([]byte, 0, 64)}
}

// Close releases the root's descriptor.
func (r *Reader) Close() {
	if r.dirfd >= 0 {
		unix.Close(r.dirfd)
		r.dirfd = -1
	}
}

// ReadFile returns the contents of <root>/<pid>/<file>, valid until the
// next call. stat and status are seq_file single records, which procfs hands
// over whole in the first read(2) when the buffer is large enough: a
// short first read is the whole file. cmdline is read to EOF, through
// fingerprint.ReadMemory.
//
// stat is read with raw system calls (no scheduler hand-off): reading
// it never waits on the target process (unlike cmdline, which takes its
// memory map lock), and the hand-offs the Go runtime makes around
// thousands of short system calls cost more than the calls themselves.
func (r *Reader) ReadFile(pid int, file string) ([]byte, error) {
	if file == "cmdline" || file == "environ" {
		return r.readMemory(pid, file)
	}
	raw := file == "stat"
	r.name = strconv.AppendInt(r.name[:0], int64(pid), 10)
	r.name = append(r.name, '/')
	r.name = append(r.name, file...)
	if r.dirfd < 0 {
		r.name = append([]byte(r.root+"/"), r.name...)
	}
	r.name = append(r.name, 0)
	fd, err := openat(r.dirfd, r.name, raw)
	if err != nil {
		return nil, fingerprint.ReadError(pid, err)
	}
	defer closefd(fd, raw)
	var n int
	r.buf, n, err = readAll(fd, r.buf, true, raw)
	if err != nil {
		return nil, fingerprint.ReadError(pid, fmt.Errorf("%s: %w", file, err))
	}
	return r.buf[:n], nil
}

// readMemory reads a file that copies pid's memory. A read given up on
// runs on alone, so it opens by path (the root's descriptor may be
// closed under it) and keeps the buffer it was handed.
func (r *Reader) readMemory(pid int, file string) ([]byte, error) {
	path := append([]byte(r.root+"/"+strconv.Itoa(pid)+"/"+file), 0)
	buf, grown := r.buf, []byte(nil)
	r.buf = nil
	data, err := fingerprint.ReadMemory(r.root, pid, func() ([]byte, error) {
		fd, err := openat(unix.AT_FDCWD, path, false)
		if err != nil {
			return nil, err
		}
		defer closefd(fd, false)
		var n int
		grown, n, err = readAll(fd, buf, false, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return grown[:n], nil
	})
	switch {
	case errors.Is(err, fingerprint.ErrStalled) || grown == nil:
		// Not read, or still being read into buf: not ours any more.
		r.buf = make([]byte, 4096)
	default:
		r.buf = grown
	}
	if err != nil {
		return nil, fingerprint.ReadError(pid, err)
	}
	return data, nil
}

// readAll reads fd into buf, growing it up to fingerprint.MaxFile+1
// bytes (one byte past the cap tells a file of exactly MaxFile bytes from
// a larger one), and returns the buffer and the length read. A single
// record ends at the first short read.
func readAll(fd int, buf []byte, single, raw bool) ([]byte, int, error) {
	const most = fingerprint.MaxFile + 1
	n := 0
	for n < most {
		if n == len(buf) {
			buf = append(buf, make([]byte, min(max(len(buf), 4096), most-len(buf)))...)
		}
		m, err := readfd(fd, buf[n:], raw)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return buf, 0, err
		}
		if m == 0 {
			return buf, n, nil
		}
		n += m
		if single && n < len(buf) {
			return buf, n, nil
		}
	}
	return buf, 0, fingerprint.ErrTooLarge
}

// openat opens the NUL-terminated path relative to dirfd (an absolute
// path when dirfd is -1 or AT_FDCWD).
func openat(dirfd int, path []byte, raw bool) (int, error) {
	if dirfd < 0 {
		dirfd = unix.AT_FDCWD
	}
	for {
		var fd uintptr
		var errno unix.Errno
		if raw {
			fd, _, errno = unix.RawSyscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
		} else {
			fd, _, errno = unix.Syscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(&path[0])), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
		}
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
}

func readfd(fd int, p []byte, raw bool) (int, error) {
	var n uintptr
	var errno unix.Errno
	if raw {
		n, _, errno = unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	} else {
		n, _, errno = unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func closefd(fd int, raw bool) {
	if raw {
		unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
		return
	}
	unix.Close(fd)
}

// Stat is fingerprint.ReadStat through r.
func (r *Reader) Stat(pid int) (fingerprint.Stat, error) {
	return fingerprint.ReadStatFrom(r, pid)
}

// IdentitySince is fingerprint.ReadSince through r: the identity of a
// process seen started at start.
func (r *Reader) IdentitySince(pid int, start uint64) (fingerprint.Identity, error) {
	return fingerprint.ReadSince(r, pid, start)
}

// Identity is fingerprint.Read through r.
func (r *Reader) Identity(pid int) (fingerprint.Identity, error) {
	return fingerprint.ReadFrom(r, pid)
}

// Argv is fingerprint.ReadArgv through r.
func (r *Reader) Argv(pid int) ([]string, error) {
	data, err := r.ReadFile(pid, "cmdline")
	if err != nil {
		return nil, err
	}
	return fingerprint.SplitArgv(data), nil
}
