package sweep

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
)

// DefaultDirs are the socket directories swept when none are given:
// Kallichore's fallbacks ($XDG_RUNTIME_DIR, else the temp dir).
var DefaultDirs = []string{"/tmp", "/run/user/*"}

// errMountPoint marks an entry with something mounted over it.
var errMountPoint = errors.New("a mount point")

// Target is where socket directories are looked up.
type Target struct {
	// InitPID is the host PID of a container's init process. The socket
	// directories are then resolved inside that container's root
	// (/proc/<InitPID>/root, symlinks confined to it), socket owners are
	// looked up in its PID namespace and listeners in its network
	// namespace. 0 means the host.
	InitPID int
	// StartTicks is the init's start time as it was resolved (or read
	// with --container-pid): the sweep pins the init by it and refuses a
	// PID that is another process's by then. 0 checks nothing.
	StartTicks uint64
}

// Container reports whether t is a container rather than the host.
func (t Target) Container() bool { return t.InitPID > 0 }

// dir is an open socket directory. Every later look-up, probe and unlink
// goes through fd, so a directory renamed or replaced by a symlink after
// it was opened cannot redirect them.
type dir struct {
	f     *os.File
	fd    int
	inner string // path inside the target (what a supervisor there bound)
	shown string // host-visible path, for reports
	uid   int    // owner of the directory
	mode  uint32 // its permission bits
	dev   uint64
	ino   uint64
	mount uint64 // its mount ID (0: not reported)
	// othersLeft counts the names past maxOthers that parse as sockets'
	// but are listed as another file type: not reported, never acted on.
	othersLeft int
}

// ownerOK applies the ownership rule for sockets in d: in a directory that
// is not world-writable (e.g. /run/user/<uid>) a socket must belong to the
// directory's owner; in a world-writable one (sticky /tmp) any owner is
// accepted, and UnlinkAt later insists on the owner recorded at
// classification.
func (d *dir) ownerOK(uid int) (bool, string) {
	if d.mode&0o002 != 0 || uid == d.uid {
		return true, ""
	}
	return false, fmt.Sprintf("owned by uid %d, not by the directory's owner (uid %d)", uid, d.uid)
}

func (d *dir) close() {
	if d.f != nil {
		d.f.Close()
		// Socket.Pin must not use the number: it may be another file's.
		d.f, d.fd = nil, -1
	}
}

// openDirs opens the directories that patterns name. A pattern may have
// wildcards (filepath.Match syntax) in its last component; a pattern
// without them names one directory, and failing to open it is an error.
// Directories reached twice are opened once.
func openDirs(t Target, g pathwalk.Guard, patterns []string) ([]*dir, []error) {
	var (
		out  []*dir
		errs []error
		seen = map[[2]uint64]bool{}
	)
	var root *os.File
	if t.Container() {
		p := "/proc/" + strconv.Itoa(t.InitPID) + "/root"
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, []error{fmt.Errorf("container root %s: %w", p, err)}
		}
		root = os.NewFile(uintptr(fd), p)
		defer root.Close()
	}
	add := func(d *dir, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		key := [2]uint64{d.dev, d.ino}
		if seen[key] {
			d.close()
			return
		}
		seen[key] = true
		out = append(out, d)
	}
	for _, pat := range patterns {
		pat = filepath.Clean(pat)
		if !filepath.IsAbs(pat) {
			errs = append(errs, fmt.Errorf("socket directory %q is not absolute", pat))
			continue
		}
		parent, last := filepath.Split(pat)
		if hasMeta(parent) {
			errs = append(errs, fmt.Errorf("socket directory %q: wildcards are only allowed in the last component", pat))
			continue
		}
		if err := g.Refuse(pat); err != nil && !hasMeta(last) {
			errs = append(errs, err)
			continue
		}
		if !hasMeta(last) {
			add(openDir(root, g, pat, false))
			continue
		}
		if err := g.Refuse(parent); err != nil {
			errs = append(errs, err)
			continue
		}
		names, err := listNames(root, g, parent, func(n string) bool {
			ok, _ := filepath.Match(last, n)
			return ok
		})
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("socket directory pattern %q: %w", pat, err))
			}
			continue
		}
		sort.Strings(names)
		for _, n := range names {
			if err := g.Refuse(filepath.Join(parent, n)); err != nil {
				errs = append(errs, globMatch{err})
				continue
			}
			// A match that is a symlink is not followed: whoever can
			// create entries next to the directories a glob is meant to
			// match (a world-writable parent) could otherwise point the
			// sweep at any directory on the host.
			d, err := openDir(root, g, filepath.Join(parent, n), true)
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue
			}
			if errors.Is(err, pathwalk.ErrOnFUSE) || errors.Is(err, pathwalk.ErrNewMount) {
				err = globMatch{err}
			}
			add(d, err)
		}
	}
	return out, errs
}

// globMatch is the refusal of a directory a pattern's wildcard matched:
// a user's FUSE mount among /run/user/* is his own, and refusing it is
// no failed sweep.
type globMatch struct{ error }

func (e globMatch) Unwrap() error { return e.error }

// CheckDirPattern reports whether pattern is a socket directory openDirs
// can use: absolute, wildcards (filepath.Match syntax) only in the last
// component, and a well-formed glob.
func CheckDirPattern(pattern string) error {
	if pattern == "" || !filepath.IsAbs(pattern) {
		return fmt.Errorf("socket directory %q is not absolute", pattern)
	}
	parent, last := filepath.Split(filepath.Clean(pattern))
	if hasMeta(parent) {
		return fmt.Errorf("socket directory %q: wildcards are only allowed in the last component", pattern)
	}
	if _, err := filepath.Match(last, ""); err != nil {
		return fmt.Errorf("socket directory %q: %w", pattern, err)
	}
	return nil
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// openDir opens inner (an absolute path inside the target), through
// symlinks but, with noFollow, a symlink as its last component (ENOTDIR,
// as O_PATH opens it). Its components are opened one at a time and each
// entered only once g accepts its mount (walk).
func openDir(root *os.File, g pathwalk.Guard, inner string, noFollow bool) (*dir, error) {
	w := pathwalk.Walk{Guard: g, Follow: true, FollowLast: !noFollow}
	base, shown := -1, inner
	if root == nil {
		fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: "/", Err: err}
		}
		defer unix.Close(fd)
		base = fd
	} else {
		base, w.InRoot, w.Prefix = int(root.Fd()), true, root.Name()
		shown = root.Name() + inner
	}
	fd, err := w.Open(base, inner)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path != shown {
		err = fmt.Errorf("%s: %w", shown, err) // stopped on the way, or through a symlink
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	st, err := pathwalk.Fstat(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: shown, Err: err}
	}
	return enter(fd, inner, shown, st)
}

// enter opens the directory held by the O_PATH descriptor pathFD for
// listing, through that descriptor: what was checked is what is listed.
// Opening for reading is the first access a file system's server sees, so
// a user's FUSE directory must have been refused before.
func enter(pathFD int, inner, shown string, st pathwalk.Stat) (*dir, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pathFD), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: shown, Err: err}
	}
	return dirOf(fd, inner, shown, st), nil
}

// openDiscovered opens inner, a directory a process named, only if no
// component of it is a symlink and it is a directory owned by root or by
// one of owners (the UIDs of the processes that named it). Otherwise a
// user's kcserver could point root's sweep, through a symlink, at a
// directory only root may write, or at someone else's.
//
// Each component is opened O_PATH with O_NOFOLLOW relative to the one
// before, so nothing is resolved by path after the check: what is checked
// is what is swept. A component on a user's FUSE mount, or on one mounted
// since g's table was read, is refused before anything in it is looked
// up.
func openDiscovered(t Target, g pathwalk.Guard, inner string, owners []int) (*dir, error) {
	if err := g.Refuse(inner); err != nil {
		return nil, err
	}
	base, shown := "/", inner
	if t.Container() {
		base = "/proc/" + strconv.Itoa(t.InitPID) + "/root"
		shown = base + inner
	}
	bfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: base, Err: err}
	}
	// Only where a process that named it could have bound a socket:
	// through directories one of them may search, to one it owns or
	// anyone may write (/tmp). A user's kcserver naming another
	// container's /tmp under /var/lib, or any root-only directory, would
	// have root sweep it, judged in namespaces that are not its own.
	rootNamed := slices.Contains(owners, 0)
	w := pathwalk.Walk{Guard: g, Through: func(shown string, st pathwalk.Stat) error {
		if rootNamed || slices.ContainsFunc(owners, func(uid int) bool { return searchable(st, uid) }) {
			return nil
		}
		return fmt.Errorf("%s: not searchable by uid %s, which named a directory below it", shown, joinInts(owners))
	}}
	if t.Container() {
		w.InRoot, w.Prefix = true, base
	}
	fd, err := w.Open(bfd, inner)
	unix.Close(bfd)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &fs.PathError{Op: "open", Path: shown, Err: fs.ErrNotExist}
	}
	if err != nil {
		return nil, err // it names the component where the walk stopped
	}
	defer unix.Close(fd)
	st, err := pathwalk.Fstat(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: shown, Err: err}
	}
	if uid := int(st.Uid); uid != 0 && !slices.Contains(owners, uid) {
		return nil, fmt.Errorf("%s: owned by uid %d, neither root nor the uid of a process that named it (%s)", shown, uid, joinInts(owners))
	}
	if st.Uid == 0 && !rootNamed && st.Mode&0o002 == 0 {
		return nil, fmt.Errorf("%s: root's, and none of the uids that named it (%s) may write it", shown, joinInts(owners))
	}
	return enter(fd, inner, shown, st)
}

// searchable says whether uid may look names up in the directory st
// (its owner's x bit, else the others'; a group's is not counted: no
// process's groups are known here, and a refusal is the safe side).
func searchable(st pathwalk.Stat, uid int) bool {
	if int(st.Uid) == uid {
		return st.Mode&0o100 != 0
	}
	return st.Mode&0o001 != 0
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// listNames lists the names in a directory inside the target (or on the
// host) that keep accepts.
func listNames(root *os.File, g pathwalk.Guard, inner string, keep func(string) bool) ([]string, error) {
	d, err := openDir(root, g, inner, false)
	if err != nil {
		return nil, err
	}
	defer d.close()
	l, err := readNames(d.fd, keep, unix.DT_DIR, limits{names: maxNames, entries: maxEntries}, nil)
	return l.names, err
}

// maxNames bounds the names of the wanted file type one directory listing
// keeps; maxOthers those of other types (look-alikes, reported as such);
// maxEntries the entries it reads at all, of any name.
const (
	maxNames   = 1 << 16
	maxOthers  = 1 << 10
	maxEntries = 1 << 24
)

// limits are readNames' bounds.
type limits struct{ names, others, entries int }

// listing is what readNames kept of a directory.
type listing struct {
	names []string
	// left counts the names of other types not kept past maxOthers.
	left int
}

// shareOut divides lim.names, the sockets one sweep holds, among dirs:
// a user who may name directories of his own (discover) and fills each
// with sockets neither makes the sweep large nor crowds the others out.
// Each directory's sockets are counted first (names only, nothing
// kept); a directory with fewer than an equal share of what is left
// keeps room for all of them, the rest share what remains equally, and
// what no directory needed is shared out as room to grow in.
func shareOut(dirs []*dir, lim limits) []int {
	caps := make([]int, len(dirs))
	if len(dirs) < 2 {
		for i := range caps {
			caps[i] = lim.names
		}
		return caps
	}
	counts := make([]int, len(dirs))
	order := make([]int, len(dirs))
	for i, d := range dirs {
		counts[i], order[i] = d.countSockets(lim.names, lim.entries), i
	}
	sort.SliceStable(order, func(a, b int) bool { return counts[order[a]] < counts[order[b]] })
	left := lim.names
	for k, i := range order {
		caps[i] = min(counts[i], left/(len(dirs)-k))
		left -= caps[i]
	}
	for i := range caps {
		caps[i] += left / len(dirs)
	}
	return caps
}

// countSockets counts the names that look like supervisor sockets and
// are listed as sockets (or of no type), up to upTo of them (more would
// change no share) and entries read; it keeps none. The offset is
// rewound, before and after.
func (d *dir) countSockets(upTo, entries int) int {
	if _, err := d.f.Seek(0, 0); err != nil {
		return 0
	}
	defer d.f.Seek(0, 0)
	n, read := 0, 0
	buf := make([]byte, 32<<10)
	for read <= entries && n < upTo {
		more, err := readDirents(d.fd, buf, func(name string, typ uint8) {
			read++
			if typ != unix.DT_SOCK && typ != unix.DT_UNKNOWN {
				return
			}
			if _, ok := sockets.ParseName(name); ok {
				n++
			}
		})
		if err != nil || !more {
			break
		}
	}
	return n
}

// readNames reads the names in the directory open at fd a batch at a time
// and keeps those keep accepts: anyone may fill /tmp with names, and only
// the few that matter are held. Names of the file type want (a DT_*
// value, as the directory lists it; the caller's lstat decides) come
// first, at most lim.names of them: past that it returns those kept with
// an error. Names of other types, which no sweep acts on, are kept up to
// lim.others and then only counted, so that files named like sockets
// never crowd a socket out. With owner, the wanted names are shared
// among their owners (a UID, -1 for none known) max-min fairly (shares):
// one user's sockets in /tmp never crowd another's out either; past
// lim.names the listing goes on, and what was left is an error at the
// end. A file system that lists no types (DT_UNKNOWN) has its names taken
// as of type want. A directory that lists more than lim.entries entries
// of any name (a file system that never ends its listing) is an error
// too.
func readNames(fd int, keep func(string) bool, want uint8, lim limits, owner func(string) int) (listing, error) {
	var l listing
	kept, read := 0, 0
	var full error
	var fair *shares
	if owner != nil {
		fair = newShares(lim.names)
	}
	buf := make([]byte, 32<<10)
	for {
		more, err := readDirents(fd, buf, func(n string, typ uint8) {
			if full != nil {
				return
			}
			if read++; read > lim.entries {
				full = fmt.Errorf("more than %d entries in all: the rest are left", lim.entries)
				return
			}
			if !keep(n) {
				return
			}
			if typ != want && typ != unix.DT_UNKNOWN {
				if len(l.names)-kept == lim.others {
					l.left++
					return
				}
			} else {
				if fair != nil {
					fair.offer(owner(n), n)
					return
				}
				if kept == lim.names {
					full = fmt.Errorf("more than %d entries to read: the rest are left", lim.names)
					return
				}
				kept++
			}
			l.names = append(l.names, n)
		})
		if fair != nil && (full != nil || err != nil || !more) {
			l.names = append(l.names, fair.names()...)
		}
		switch {
		case full != nil:
			return l, full
		case err != nil:
			return l, err
		case !more:
			if fair != nil {
				return l, fair.err()
			}
			return l, nil
		}
	}
}

// readDirents reads one batch of the directory open at fd with getdents64
// and calls fn with each entry's name and type as the directory lists
// them. Unlike os.File.ReadDir it never lstats an entry whose type the
// file system leaves unknown: on a FUSE mount that lstat can fail, or
// wait, for a name nobody asked about. more is false at the end.
func readDirents(fd int, buf []byte, fn func(name string, typ uint8)) (more bool, err error) {
	var n int
	for {
		n, err = unix.Getdents(fd, buf)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return false, err
	}
	return n > 0, parseDirents(buf[:n], fn)
}

// parseDirents calls fn for each struct linux_dirent64 in buf (d_ino u64,
// d_off s64, d_reclen u16, d_type u8, d_name NUL-terminated) but "." and
// "..".
func parseDirents(buf []byte, fn func(name string, typ uint8)) error {
	const nameOff = 19
	for off := 0; off < len(buf); {
		if off+nameOff > len(buf) {
			return errors.New("getdents64: truncated entry")
		}
		reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
		if reclen <= nameOff || off+reclen > len(buf) {
			return errors.New("getdents64: bad record length")
		}
		name := buf[off+nameOff : off+reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if s := string(name); s != "." && s != ".." {
			fn(s, buf[off+18])
		}
		off += reclen
	}
	return nil
}

// entry is one kc-*.sock directory entry as lstat saw it.
type entry struct {
	dir     *dir
	name    string
	parsed  sockets.Name
	mode    uint32 // file type bits (S_IFMT)
	uid     int
	dev     uint64
	ino     uint64
	ctime   unix.Timespec
	changed time.Time // the later of ctime and mtime
	// err is why the entry could not be lstat'ed; the rest is then zero.
	err error
}

// scan lists d's entries whose names parse as supervisor sockets and
// lstats them (fstatat with AT_SYMLINK_NOFOLLOW, relative to d's fd),
// within lim. Entries that vanish meanwhile are skipped; one that cannot
// be lstat'ed is returned with its error, and the others are still read.
// An error listing d is returned with the entries listed before it. Each
// name counts, for the listing's fair shares, against the user owner
// gives its file's UID to: a rootless user's subordinate UIDs are his.
func (d *dir) scan(g pathwalk.Guard, lim limits, owner func(uid int) int) ([]*entry, error) {
	// Reading advances the descriptor's offset; rewind so a directory
	// can be scanned again (and so the fd is left as found).
	if _, err := d.f.Seek(0, 0); err != nil {
		return nil, err
	}
	l, listErr := readNames(d.fd, func(n string) bool {
		_, ok := sockets.ParseName(n)
		return ok
	}, unix.DT_SOCK, lim, func(n string) int {
		if g.MountPoint(filepath.Join(d.inner, n)) != nil {
			return -1
		}
		st, err := pathwalk.Lstat(d.fd, n)
		if err != nil || !st.OnMount(d.mount) {
			return -1
		}
		return owner(int(st.Uid))
	})
	if listErr != nil {
		listErr = fmt.Errorf("list %s: %w", d.shown, listErr)
	}
	d.othersLeft = l.left
	names := l.names
	sort.Strings(names)
	var out []*entry
	for _, n := range names {
		p, ok := sockets.ParseName(n)
		if !ok {
			continue
		}
		// Not even lstat'ed: a user's FUSE mount point would ask its
		// server.
		e, err := (*entry)(nil), g.MountPoint(filepath.Join(d.inner, n))
		if err == nil {
			e, err = d.lstat(n)
		}
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			e = &entry{dir: d, name: n, err: err}
		}
		e.parsed = p
		out = append(out, e)
	}
	return out, listErr
}

// lstat stats name without waiting on a file system's server, and
// refuses a mount point: a mount put over the name after the mount table
// was read (see pathwalk.Guard) is still not entered.
func (d *dir) lstat(name string) (*entry, error) {
	st, err := pathwalk.Lstat(d.fd, name)
	if !st.OnMount(d.mount) {
		// Also when err is EACCES: a FUSE mount of a user who allows no
		// one else.
		return nil, fmt.Errorf("%w (mount %d, the directory's %d): what is mounted there is not the directory's, not entered", errMountPoint, st.MountID, d.mount)
	}
	if err != nil {
		return nil, err
	}
	changed := time.Unix(st.Mtim.Unix())
	if c := time.Unix(st.Ctim.Unix()); c.After(changed) {
		changed = c
	}
	return &entry{
		dir: d, name: name,
		mode: st.Mode & unix.S_IFMT, uid: int(st.Uid),
		dev: st.Dev, ino: st.Ino, ctime: st.Ctim, changed: changed,
	}, nil
}

func (e *entry) isSocket() bool { return e.mode == unix.S_IFSOCK }

func (e *entry) shownPath() string { return path.Join(e.dir.shown, e.name) }
func (e *entry) innerPath() string { return path.Join(e.dir.inner, e.name) }

// file is the socket file e names, as it was lstat'ed.
func (e *entry) file() sockets.File { return sockets.File{Dev: e.dev, Ino: e.ino, UID: e.uid} }

// FileType names a file type (a stat mode's S_IFMT bits) as reports write it.
func FileType(mode uint32) string {
	switch mode {
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return fmt.Sprintf("file type %#o", mode)
}

// dirOf wraps an opened directory descriptor and what fstat said of it.
func dirOf(fd int, inner, shown string, st pathwalk.Stat) *dir {
	return &dir{
		f: os.NewFile(uintptr(fd), shown), fd: fd,
		inner: inner, shown: shown,
		uid: int(st.Uid), mode: st.Mode & 0o7777,
		dev: st.Dev, ino: st.Ino, mount: st.MountID,
	}
}
