// Package mountinfo reads a mount table (proc(5)'s mountinfo) with a
// bound: users may add mounts (FUSE), and no run reads megabytes of them.
package mountinfo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Max is how much of a table Read reads; MaxWhole how much ReadWhole
// does, for a caller that must know every mount and can refuse when
// even that is not enough.
const (
	Max      = 1 << 20
	MaxWhole = 16 << 20
)

// ErrTruncated says the table went on past Max; the mounts before it are
// returned with it.
var ErrTruncated = errors.New("the rest was not read")

// Mount is one line of the table.
type Mount struct {
	// ID is the mount's ID, as statx(2)'s STATX_MNT_ID reports it.
	ID uint64
	// Dev is its file system's device, "major:minor": the same in every
	// namespace a mount of that file system is seen in.
	Dev string
	// Root is the mount's root within its file system, Point where it is
	// mounted (octal escapes undone), both as the reading process sees
	// them.
	Root, Point string
	// FSType is the file system type ("cgroup2", "fuse.sshfs"), Super its
	// per-superblock options ("rw,user_id=1000,group_id=1000").
	FSType, Super string
}

// Read reads the mount table at path (/proc/self/mountinfo,
// /proc/<pid>/mountinfo), its first Max bytes.
func Read(path string) ([]Mount, error) { return read(path, Max) }

// ReadWhole is Read up to MaxWhole bytes; past them it returns the mounts
// read with ErrTruncated, as Read does.
func ReadWhole(path string) ([]Mount, error) { return read(path, MaxWhole) }

// ReadFor is Read, read on up to MaxWhole bytes if the first Max hold no
// mount want accepts: the mounts a caller looks for (cgroupfs) come early
// in the table, and only a host that made them late pays for reading on.
func ReadFor(path string, want func(Mount) bool) ([]Mount, error) {
	ms, err := Read(path)
	if errors.Is(err, ErrTruncated) && !slices.ContainsFunc(ms, want) {
		ms, err = ReadWhole(path)
	}
	return ms, err
}

func read(path string, max int64) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, max)
}

// Table is a mount table held open, to be read again when the kernel says
// it changed: a mount ID the table gave is then no longer sure to be the
// same mount's (IDs are handed out again once freed).
type Table struct{ f *os.File }

// Open opens the mount table at path. What Changed reports is counted
// from now.
func Open(path string) (*Table, error) {
	// Not through os.Open: mountinfo can be polled, so os.Open would add
	// it to the runtime's epoll set, whose waits take the change from
	// Changed's poll(2).
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &Table{f: os.NewFile(uintptr(fd), path)}, nil
}

// Read reads the table from its start, its first max bytes (Max,
// MaxWhole).
func (t *Table) Read(max int64) ([]Mount, error) {
	ms, _, err := t.ReadN(max)
	return ms, err
}

// ReadN is Read, and says how many bytes it read.
func (t *Table) ReadN(max int64) ([]Mount, int64, error) {
	if _, err := t.f.Seek(0, io.SeekStart); err != nil {
		return nil, 0, err
	}
	lr := &io.LimitedReader{R: t.f, N: max}
	ms, err := parse(lr, max)
	return ms, max - lr.N, err
}

// Changed says whether a mount was added, removed or changed in the
// table's namespace since it was opened or Changed last said so (poll(2)'s
// POLLPRI on mountinfo); an error when the kernel cannot tell.
func (t *Table) Changed() (bool, error) {
	fds := []unix.PollFd{{Fd: int32(t.f.Fd()), Events: unix.POLLPRI}}
	for {
		_, err := unix.Poll(fds, 0)
		if err == nil {
			if fds[0].Revents&unix.POLLNVAL != 0 {
				return false, unix.EBADF
			}
			return fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0, nil
		}
		if err != unix.EINTR {
			return false, err
		}
	}
}

// Close closes the table.
func (t *Table) Close() error { return t.f.Close() }

func parse(r io.Reader, max int64) ([]Mount, error) {
	var out []Mount
	lr := &io.LimitedReader{R: r, N: max}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if !ok || len(a) < 5 || len(b) < 3 {
			continue
		}
		id, err := strconv.ParseUint(a[0], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, Mount{ID: id, Dev: a[2], Root: a[3], Point: unescape(a[4]), FSType: b[0], Super: b[2]})
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if lr.N == 0 {
		// Exactly max bytes long is taken as longer: one more read
		// would tell, and the bound is what matters.
		return out, fmt.Errorf("mount table longer than %d MiB: %w", max>>20, ErrTruncated)
	}
	return out, nil
}

// FUSEUser is the user a FUSE mount belongs to (its user_id option), and
// whether m is a FUSE mount at all.
func (m Mount) FUSEUser() (uid int, ok bool) {
	if m.FSType != "fuse" && m.FSType != "fuseblk" && !strings.HasPrefix(m.FSType, "fuse.") {
		return 0, false
	}
	for _, o := range strings.Split(m.Super, ",") {
		if v, found := strings.CutPrefix(o, "user_id="); found {
			if n, err := strconv.Atoi(v); err == nil {
				return n, true
			}
		}
	}
	// The kernel always shows user_id; without it, it is nobody's to trust.
	return -1, true
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}
