package trees

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pidLister reads the numeric entries of a procfs root with getdents64(2)
// and parses the names in place: a /proc with tens of thousands of entries
// then costs a handful of calls and no allocation per entry. Threads are
// not listed there, only thread-group leaders.
type pidLister struct {
	root string
	fd   int
	buf  []byte
}

func openPIDLister(root string, bufSize int) (*pidLister, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reading process list: %w", &os.PathError{Op: "open", Path: root, Err: err})
	}
	return &pidLister{root: root, fd: fd, buf: make([]byte, bufSize)}, nil
}

func (l *pidLister) close() { unix.Close(l.fd) }

// next appends the PIDs of the next getdents64(2) call to pids. It
// returns pids unchanged and done at the end of the directory.
func (l *pidLister) next(pids []int) (_ []int, done bool, err error) {
	for {
		// Reading a directory never waits on another process, so a raw
		// call spares the scheduler hand-off.
		r, _, errno := unix.RawSyscall(unix.SYS_GETDENTS64, uintptr(l.fd), uintptr(unsafe.Pointer(&l.buf[0])), uintptr(len(l.buf)))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return pids, false, fmt.Errorf("reading process list: %w", &os.PathError{Op: "getdents", Path: l.root, Err: errno})
		}
		if r == 0 {
			return pids, true, nil
		}
		return appendDirentPIDs(pids, l.buf[:r]), false, nil
	}
}

// appendDirentPIDs appends the numeric names among the struct
// linux_dirent64 records in buf: d_ino (8), d_off (8), d_reclen (2),
// d_type (1), d_name (NUL-terminated).
func appendDirentPIDs(pids []int, buf []byte) []int {
	for off := 0; off+19 < len(buf); {
		reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
		if reclen <= 0 || off+reclen > len(buf) {
			break
		}
		name := buf[off+19 : off+reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if pid, ok := parsePID(name); ok {
			pids = append(pids, pid)
		}
		off += reclen
	}
	return pids
}

// listPIDs lists every PID of root.
func listPIDs(root string) ([]int, error) {
	l, err := openPIDLister(root, 64<<10)
	if err != nil {
		return nil, err
	}
	defer l.close()
	pids := make([]int, 0, 1024)
	for {
		var done bool
		if pids, done, err = l.next(pids); err != nil {
			return nil, err
		}
		if done {
			return pids, nil
		}
	}
}

// parsePID accepts what strconv.Atoi accepts of a name that starts with a
// digit: decimal digits only, within int range.
func parsePID(name []byte) (int, bool) {
	if len(name) == 0 || len(name) > 18 {
		return 0, false
	}
	v := 0
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}
