package contain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// Cgroup is one container's supervisor cgroup.
type Cgroup struct {
	Kind Kind
	// Mount is the hierarchy's mount point on this host; Path is relative
	// to it.
	Mount string
	Path  string
	// Unit is the systemd scope (KindSystemd).
	Unit string
	// UID is the UID the tree runs as (trees.Rules.UID).
	UID int

	containerID string
	dirFD       int // the cgroup directory, for CLONE_INTO_CGROUP; -1 when none
	scoper      Scoper
	opt         Options
}

// Record is the ledger's view of c.
func (c *Cgroup) Record() ledger.Cgroup {
	return ledger.Cgroup{Kind: string(c.Kind), Path: c.Path, Unit: c.Unit, UID: c.UID}
}

// String is the cgroup's full path, for logs.
func (c *Cgroup) String() string {
	if c.Path == "" {
		return string(c.Kind) + ":" + c.Unit
	}
	return c.Mount + "/" + c.Path
}

// Prepare readies containerID's cgroup on h before its supervisor starts:
// <mount>/kc-watchman/<id> made (or found) on cgroupfs, or, for a
// systemd scope, its unit named (Enter starts it). uid is the UID the
// tree will run as.
func Prepare(ctx context.Context, h Host, containerID string, uid int) (*Cgroup, error) {
	if !containerid.Valid(containerID) {
		return nil, ErrBadID
	}
	c := &Cgroup{Kind: h.Kind, Mount: h.Mount, UID: uid, containerID: containerID, dirFD: -1, opt: h.opt.withDefaults()}
	switch h.Kind {
	case KindSystemd:
		if h.opt.Systemd == nil {
			return nil, errors.New("no systemd client linked")
		}
		c.Unit = UnitName(containerID)
		return c, nil
	case KindCgroup2, KindFreezer:
	default:
		return nil, fmt.Errorf("this host gives no containment: %s", h.Why)
	}
	mfd, err := openMount(h.Mount, h.Kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(mfd)
	// The parent is root's, 0755: nobody else may create, rename or
	// replace what lives below it.
	if err := unix.Mkdirat(mfd, Dir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("creating %s/%s: %w", h.Mount, Dir, err)
	}
	pfd, err := openDirAt(mfd, Dir, h.Kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	// A cgroup left by an earlier wrapper of the same container (one
	// killed before its teardown) is reused: what is in it is this
	// container's too, and the sweep takes it.
	if err := unix.Mkdirat(pfd, containerID, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("creating %s/%s/%s: %w", h.Mount, Dir, containerID, err)
	}
	fd, err := openDirAt(pfd, containerID, h.Kind)
	if err != nil {
		return nil, err
	}
	c.dirFD, c.Path = fd, Dir+"/"+containerID
	// One reused from a wrapper killed mid-sweep may be frozen still: the
	// new supervisor would start frozen.
	if err := c.thaw(fd); err != nil {
		c.opt.Logger.Warn("cannot thaw the reused cgroup", "cgroup", c.String(), "err", err)
	}
	return c, nil
}

// CloneFD is the cgroup directory's descriptor for starting a process
// straight into it (clone3 CLONE_INTO_CGROUP, SysProcAttr.UseCgroupFD):
// on cgroup v2 only, where no moment passes with the child outside.
func (c *Cgroup) CloneFD() (int, bool) {
	if c == nil || c.Kind != KindCgroup2 || c.dirFD < 0 {
		return -1, false
	}
	return c.dirFD, true
}

// Procs lists the processes of a cgroup v2 cgroup a process can be
// started into (CloneFD), through its descriptor.
func (c *Cgroup) Procs() ([]int, error) {
	fd, ok := c.CloneFD()
	if !ok {
		return nil, fmt.Errorf("%s: not a cgroup v2 cgroup held open", c)
	}
	return procs(fd)
}

// Enter moves pid, just started, into the cgroup where it could not be
// started inside: the v1 freezer (written to cgroup.procs) and a systemd
// scope (StartTransientUnit; once the scope exists, its cgroup.procs).
// Until then the process runs outside: a child it forks in that window
// stays out. Its own children start under the supervisor's control, so
// the window is the supervisor's first instructions only.
func (c *Cgroup) Enter(ctx context.Context, pid int) error {
	switch {
	case c.Kind == KindCgroup2 && c.dirFD >= 0:
		return nil // started inside
	case c.Kind == KindSystemd && (c.Path == "" || !c.Exists()):
		// systemd collects a scope once its last process is gone: a
		// restarted command gets a new one.
		c.Path = ""
		s, done, err := c.bus(ctx)
		if err != nil {
			return fmt.Errorf("starting scope %s: %w", c.Unit, err)
		}
		defer done()
		p, err := s.StartScope(ctx, c.Unit, Slice, pid)
		if err != nil {
			return fmt.Errorf("starting scope %s: %w", c.Unit, err)
		}
		rel, err := scopePath(p, c.Unit)
		if err != nil {
			return err
		}
		c.Path = rel
		return nil
	}
	mfd, err := openMount(c.Mount, c.Kind)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	fd, err := openPath(mfd, c.Path, c.Kind)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return writeAt(fd, "cgroup.procs", strconv.Itoa(pid))
}

// bus connects to systemd for one call. No connection is held for a
// container's life: root's connections to the system bus are capped
// (dbus-daemon's max_connections_per_user, 256), and a wrapper per
// container holding one would leave the runtimes none to start the next
// container with. A Scoper set on c (tests) is used as it is.
func (c *Cgroup) bus(ctx context.Context) (Scoper, func(), error) {
	if c.scoper != nil {
		return c.scoper, func() {}, nil
	}
	if c.opt.Systemd == nil {
		return nil, nil, errors.New("no systemd client linked")
	}
	s, err := c.opt.Systemd(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to systemd: %w", err)
	}
	return s, func() { s.Close() }, nil
}

// Close releases the descriptors (and a Scoper set on c); the cgroup
// stays.
func (c *Cgroup) Close() error {
	if c == nil {
		return nil
	}
	if c.dirFD >= 0 {
		unix.Close(c.dirFD)
		c.dirFD = -1
	}
	if c.scoper != nil {
		err := c.scoper.Close()
		c.scoper = nil
		return err
	}
	return nil
}

// ErrRefused: a recorded cgroup that is not one kc-watchman makes.
var ErrRefused = errors.New("not a kc-watchman cgroup")

// FromRecord validates a cgroup the ledger names for containerID and
// finds it on h's host. Only kc-watchman's own places are accepted:
// kc-watchman/<id> on cgroupfs, kc-watchman.slice/kc-watchman-<id>.scope
// for systemd; clean, relative, no "..". Symlinks are refused when the
// path is opened (Sweep).
func FromRecord(r ledger.Cgroup, containerID string, opt Options) (*Cgroup, error) {
	opt = opt.withDefaults()
	if !containerid.Valid(containerID) {
		return nil, ErrBadID
	}
	kind := Kind(r.Kind)
	var want string
	switch kind {
	case KindCgroup2, KindFreezer:
		want = Dir + "/" + containerID
	case KindSystemd:
		if r.Unit != UnitName(containerID) {
			return nil, fmt.Errorf("unit %q is not %s: %w", r.Unit, UnitName(containerID), ErrRefused)
		}
		rel, err := scopePath(r.Path, r.Unit)
		if err != nil {
			return nil, err
		}
		want = rel
	default:
		return nil, fmt.Errorf("kind %q: %w", r.Kind, ErrRefused)
	}
	p := strings.TrimPrefix(r.Path, "/")
	if p != want || path.Clean(p) != p || strings.Contains(p, "..") {
		return nil, fmt.Errorf("cgroup %q is not %s: %w", r.Path, want, ErrRefused)
	}
	ms, err := mountsOf(opt)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	mnt := ms.mountOf(kind)
	if mnt == "" {
		return nil, fmt.Errorf("no %s hierarchy is mounted here", kind)
	}
	return &Cgroup{Kind: kind, Mount: mnt, Path: p, Unit: r.Unit, UID: r.UID, containerID: containerID, dirFD: -1, opt: opt}, nil
}

// SlicePath is Slice's cgroup relative to the mount. systemd nests a
// slice under the slice its name's dashes spell (systemd.slice(5)):
// kc-watchman.slice lives in kc.slice.
const SlicePath = "kc.slice/" + Slice

// scopePath checks a scope's cgroup as systemd reports it: directly in
// Slice's cgroup, and returns it relative to the mount.
func scopePath(p, unit string) (string, error) {
	rel := strings.TrimPrefix(p, "/")
	if rel != SlicePath+"/"+unit || path.Clean(rel) != rel {
		return "", fmt.Errorf("scope cgroup %q is not %s/%s: %w", p, SlicePath, unit, ErrRefused)
	}
	return rel, nil
}

// selfInside reports whether the calling process is in c or below it: a
// sweep would freeze the caller itself. In a cgroup namespace of its own
// (a pod's) the caller's path is relative to that namespace and says
// nothing of c's: unknown, so assumed the worst.
func (c *Cgroup) selfInside() bool {
	self, err1 := os.Readlink(c.opt.Proc + "/self/ns/cgroup")
	host, err2 := os.Readlink(c.opt.Proc + "/1/ns/cgroup")
	if err1 == nil && err2 == nil && self != host {
		return true
	}
	data, err := os.ReadFile(c.opt.Proc + "/self/cgroup")
	if err != nil {
		return true // unknown: assume the worst
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		mine := c.Kind != KindFreezer && f[0] == "0" && f[1] == ""
		if c.Kind == KindFreezer {
			for _, ctl := range strings.Split(f[1], ",") {
				mine = mine || ctl == "freezer"
			}
		}
		if mine {
			p := strings.TrimPrefix(f[2], "/")
			return p == c.Path || strings.HasPrefix(p, c.Path+"/")
		}
	}
	return false
}

// Exists reports whether the cgroup's directory is still there (opened
// as Sweep would open it).
func (c *Cgroup) Exists() bool {
	if c.Path == "" {
		return false
	}
	mfd, err := openMount(c.Mount, c.Kind)
	if err != nil {
		return false
	}
	defer unix.Close(mfd)
	fd, err := openPath(mfd, c.Path, c.Kind)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
