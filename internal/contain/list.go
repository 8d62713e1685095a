package contain

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// Listed is a kc-watchman/<id> cgroup found on the host's cgroupfs.
type Listed struct {
	ContainerID string
	// Record names it as the ledger would (FromRecord takes it); UID is
	// the directory's owner, the wrapper that made it.
	Record ledger.Cgroup
	// Changed is the directory's last change: its creation, for a cgroup
	// nobody writes into.
	Changed time.Time
	// Populated: a process is in it, or it could not be read, or it has
	// not been read: List leaves that to Populate, for the few cgroups a
	// decision needs it of. Removing an empty one kills nothing; sweeping
	// a populated one does.
	Populated bool

	mount string // the hierarchy's mount point, for Populate
}

// maxListed bounds one listing: kc-watchman/ is root's, so only root
// fills it, but a run's memory never depends on a directory's size.
const maxListed = 16384

// List finds the kc-watchman/<id> cgroups on this host's cgroup v2 and
// v1 freezer hierarchies: one directory read each. A wrapper killed
// before its teardown (reaped by poststop or reconcile where no ledger
// names its cgroup) leaves one behind. systemd scopes are not listed:
// systemd removes a scope once it is empty.
func List(opt Options) ([]Listed, error) {
	return list(opt, "")
}

// Find is List for the cgroup(s) of one container: one fstatat(2) per
// hierarchy instead of a directory read.
func Find(opt Options, containerID string) ([]Listed, error) {
	if !containerid.Valid(containerID) {
		return nil, fmt.Errorf("%q is not a container ID", containerID)
	}
	return list(opt, containerID)
}

// list lists kc-watchman/<only>, or every kc-watchman/<id> when only is
// empty.
func list(opt Options, only string) ([]Listed, error) {
	opt = opt.withDefaults()
	ms, err := mountsOf(opt)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var out []Listed
	var errs []error
	for _, kind := range []Kind{KindCgroup2, KindFreezer} {
		mnt := ms.mountOf(kind)
		if mnt == "" {
			continue
		}
		l, err := listIn(mnt, kind, only)
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, l...)
	}
	return out, errors.Join(errs...)
}

func listIn(mnt string, kind Kind, only string) ([]Listed, error) {
	mfd, err := openMount(mnt, kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(mfd)
	pfd, err := openDirAt(mfd, Dir, kind)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", mnt, Dir, err)
	}
	// The fd is the directory checked above, whatever replaces the path.
	dir := os.NewFile(uintptr(pfd), mnt+"/"+Dir)
	defer dir.Close()
	names := []string{only}
	if only == "" {
		names, err = dir.Readdirnames(maxListed)
		if err != nil && len(names) == 0 {
			return nil, nil // empty (io.EOF), or unreadable: nothing to list
		}
	}
	var out []Listed
	for _, n := range names {
		if !containerid.Valid(n) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		out = append(out, Listed{
			ContainerID: n,
			Record:      ledger.Cgroup{Kind: string(kind), Path: Dir + "/" + n, UID: int(st.Uid)},
			Changed:     time.Unix(st.Mtim.Unix()),
			Populated:   true, // until Populate reads it
			mount:       mnt,
		})
	}
	return out, nil
}

// Populate reads whether each of ls (as List returned them) holds a
// process: one cgroup.events read each (cgroup.procs on the v1 freezer).
// One it cannot read stays populated.
func Populate(ls []Listed) error {
	byMount := map[string][]*Listed{}
	var mounts []string
	for i := range ls {
		m := ls[i].mount
		if m == "" {
			continue // not from List: stays populated
		}
		if _, ok := byMount[m]; !ok {
			mounts = append(mounts, m)
		}
		byMount[m] = append(byMount[m], &ls[i])
	}
	var errs []error
	for _, m := range mounts {
		these := byMount[m]
		if err := populateIn(m, Kind(these[0].Record.Kind), these); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func populateIn(mnt string, kind Kind, ls []*Listed) error {
	mfd, err := openMount(mnt, kind)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	pfd, err := openDirAt(mfd, Dir, kind)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", mnt, Dir, err)
	}
	defer unix.Close(pfd)
	for _, l := range ls {
		l.Populated = populated(pfd, l.ContainerID, kind)
	}
	return nil
}

// populated reads whether the cgroup name below dirfd holds a process;
// one it cannot read counts as populated.
func populated(dirfd int, name string, kind Kind) bool {
	fd, err := openDirAt(dirfd, name, kind)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	if kind != KindFreezer {
		return !eventIs(fd, "populated", "0")
	}
	pids, err := procs(fd)
	return err != nil || len(pids) > 0
}
