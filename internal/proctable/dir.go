package proctable

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dir reads the numeric entries of a procfs root with getdents64(2) and
// parses the names in place: a /proc with tens of thousands of entries
// then costs a handful of calls and no allocation per entry. On a VM
// where a system call costs a microsecond, that is most of what listing
// /proc costs. Threads are not listed there, only thread-group leaders.
type dir struct {
	root string
	fd   int
	buf  []byte
}

// openDir opens root for listing, bufSize bytes per getdents64(2) call.
func openDir(root string, bufSize int) (*dir, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reading process list: %w", &os.PathError{Op: "open", Path: root, Err: err})
	}
	return &dir{root: root, fd: fd, buf: make([]byte, bufSize)}, nil
}

// Close releases the directory.
func (l *dir) Close() { unix.Close(l.fd) }

// Next appends the PIDs of the next getdents64(2) call to pids. It
// returns pids unchanged and done at the end of the directory.
func (l *dir) Next(pids []int) (_ []int, done bool, err error) {
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
		if pid, ok := ParsePID(name); ok {
			pids = append(pids, pid)
		}
		off += reclen
	}
	return pids
}

// PIDs lists every PID of root, in the order of its directory (ascending
// on procfs), with getdents64(2). It is a snapshot of the directory alone:
// List is the listing with groups, and with the BPF task iterator.
func PIDs(root string) ([]int, error) {
	l, err := openDir(root, 64<<10)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	pids := make([]int, 0, 1024)
	for {
		var done bool
		if pids, done, err = l.Next(pids); err != nil {
			return nil, err
		}
		if done {
			return pids, nil
		}
	}
}

// ParsePID accepts what strconv.Atoi accepts of a name that starts with a
// digit: decimal digits only, within int range.
func ParsePID(name []byte) (int, bool) {
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

// InGroup returns the processes of the host's /proc (this process's PID
// namespace) whose process group is pgid now, and those getpgid(2) could
// not answer for other than ESRCH (the caller must read them to tell).
// The getpgid calls are spread over the CPUs: they are nearly all of the
// cost. Zombies are included; so may be processes that left the group
// since: the caller reads what it keeps.
func InGroup(pgid int) ([]int, error) {
	pids, err := PIDs("/proc")
	if err != nil {
		return nil, err
	}
	workers := max(1, min(runtime.GOMAXPROCS(0), len(pids)/minPIDsPerWorker))
	chunk := (len(pids) + workers - 1) / workers
	found := make([][]int, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, pid := range pids[min(len(pids), w*chunk):min(len(pids), (w+1)*chunk)] {
				// getpgid(2) never blocks: a raw call spares the
				// scheduler hand-off, which costs more than the call.
				r, _, errno := unix.RawSyscall(unix.SYS_GETPGID, uintptr(pid), 0, 0)
				if (errno == 0 && int(r) == pgid) || (errno != 0 && errno != unix.ESRCH) {
					found[w] = append(found[w], pid)
				}
			}
		}()
	}
	wg.Wait()
	var out []int
	for _, f := range found {
		out = append(out, f...)
	}
	return out, nil
}
