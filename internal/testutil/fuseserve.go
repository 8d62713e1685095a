package testutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// StalledFile is a file of a FUSE file system served by the test whose
// contents are never sent, as a hostile user's server would: it can be
// opened and mapped; the first read of it fails (EIO) and every later one
// waits until the connection is aborted. The failed first read matters
// to a page fault on a mapping of it: the fault, its lock let go for the
// read, is retried holding the process's memory map lock, and that read
// is never answered.
type StalledFile struct {
	Path  string
	reads atomic.Int64
	abort func()
}

// Reads is how many reads of the file the server has been asked for.
func (f *StalledFile) Reads() int64 { return f.reads.Load() }

// stalledSize is the size the stalled file claims: a mapping must lie
// within it, or its pages fault as SIGBUS without asking.
const stalledSize = 1 << 20

// FUSE opcodes and the sizes of the structures answered (linux/fuse.h).
const (
	fuseLookup      = 1
	fuseForget      = 2
	fuseGetattr     = 3
	fuseOpen        = 14
	fuseRead        = 15
	fuseRelease     = 18
	fuseFlush       = 25
	fuseInit        = 26
	fuseInterrupt   = 36
	fuseBatchForget = 42

	fuseInHeader  = 40
	fuseOutHeader = 16
	fuseAttrSize  = 88
)

// ServeStalledFile mounts a FUSE file system on dir/name (made if
// missing) holding one file, "stalled", and serves it from a goroutine
// that answers what opening and mapping it take, fails the first read
// and answers no other.
// allow_other lets root and other users in. Skips where FUSE is missing.
func ServeStalledFile(t testing.TB, dir, name string) *StalledFile {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Fatal(err)
	}
	// Non-blocking: the server polls, so that it can be told to stop (a
	// read blocked on /dev/fuse is not woken by closing it).
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := unix.Mount("kc-test", p, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Skipf("cannot mount FUSE here: %v", err)
	}
	f := &StalledFile{Path: filepath.Join(p, "stalled")}
	var stop atomic.Bool
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveStalled(fd, &stop, f)
	}()
	f.abort = sync.OnceFunc(func() {
		stop.Store(true)
		<-served
		// The connection's last descriptor: closing it aborts the
		// connection, which fails the requests left unanswered.
		unix.Close(fd)
	})
	t.Cleanup(func() {
		f.Abort()
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", p, err)
		}
	})
	return f
}

// Abort ends the connection: every request left unanswered fails, and so
// do later ones. A process waiting on the server may not be killable
// until then; a test kills such a process after Abort.
func (f *StalledFile) Abort() { f.abort() }

// serveStalled answers requests on fd until stop is set or fd fails.
func serveStalled(fd int, stop *atomic.Bool, f *StalledFile) {
	buf := make([]byte, 1<<17+4096) // past max_write and its headers
	le := binary.LittleEndian
	for !stop.Load() {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 50); err != nil && err != unix.EINTR {
			return
		}
		n, err := unix.Read(fd, buf)
		switch err {
		case nil:
		case unix.EAGAIN, unix.EINTR, unix.ENOENT: // nothing yet, or a request interrupted
			continue
		default:
			return
		}
		if n < fuseInHeader {
			return
		}
		op, unique, node := le.Uint32(buf[4:]), le.Uint64(buf[8:]), le.Uint64(buf[16:])
		var body []byte
		errno := int32(0)
		switch op {
		case fuseInit:
			body = make([]byte, 64)
			le.PutUint32(body[0:], 7)      // major
			le.PutUint32(body[4:], 31)     // minor
			le.PutUint32(body[20:], 1<<16) // max_write
			le.PutUint32(body[24:], 1)     // time_gran
		case fuseLookup:
			if node != 1 || string(cString(buf[fuseInHeader:n])) != "stalled" {
				errno = -int32(unix.ENOENT)
				break
			}
			body = make([]byte, 40+fuseAttrSize)
			le.PutUint64(body[0:], 2)     // nodeid
			le.PutUint64(body[16:], 3600) // entry_valid
			le.PutUint64(body[24:], 3600) // attr_valid
			putAttr(body[40:], 2)
		case fuseGetattr:
			body = make([]byte, 16+fuseAttrSize)
			le.PutUint64(body[0:], 3600) // attr_valid
			putAttr(body[16:], node)
		case fuseOpen:
			body = make([]byte, 16)
			le.PutUint64(body[0:], 1) // fh
		case fuseRead:
			if f.reads.Add(1) == 1 {
				errno = -int32(unix.EIO)
				break
			}
			continue // never answered
		case fuseRelease, fuseFlush:
		case fuseForget, fuseBatchForget, fuseInterrupt:
			continue // no answer expected
		default:
			errno = -int32(unix.ENOSYS)
		}
		out := make([]byte, fuseOutHeader+len(body))
		le.PutUint32(out[0:], uint32(len(out)))
		le.PutUint32(out[4:], uint32(errno))
		le.PutUint64(out[8:], unique)
		copy(out[fuseOutHeader:], body)
		if _, err := unix.Write(fd, out); err != nil && err != unix.ENOENT {
			return
		}
	}
}

// putAttr writes the fuse_attr of node: 1 the root directory, anything
// else the stalled file.
func putAttr(b []byte, node uint64) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], node) // ino
	mode, nlink := uint32(unix.S_IFREG|0o444), uint32(1)
	if node == 1 {
		mode, nlink = unix.S_IFDIR|0o755, 2
	} else {
		le.PutUint64(b[8:], stalledSize)      // size
		le.PutUint64(b[16:], stalledSize/512) // blocks
	}
	le.PutUint32(b[60:], mode)
	le.PutUint32(b[64:], nlink)
	le.PutUint32(b[80:], 4096) // blksize
}

// cString is b up to its first NUL.
func cString(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
