// Package ledger stores what kc-watchman knows about each container, one
// JSON file per container under <state-dir>/containers (DESIGN "Ledger").
//
// Hooks of many containers run at once and the janitor may run beside them,
// so every change is a read-modify-write under an exclusive flock on the
// directory's lock file, and every write is atomic: a temporary file in the
// same directory, renamed over the record (package atomicfile). A reader never
// sees a torn record, and a writer killed at any point leaves either the old
// record or the new one (plus, at worst, a stray temporary file that List
// ignores and GC removes).
package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/atomicfile"
	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/trust"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// LockTimeout bounds the wait for the ledger lock.
const LockTimeout = 5 * time.Second

// ErrLocked is returned (wrapped) when the ledger lock could not be had
// within LockTimeout.
var ErrLocked = errors.New("ledger locked")

// ErrBadID is returned for anything that is not a full container ID; it
// keeps path traversal out of the state dir.
var ErrBadID = errors.New("not a 64-character lowercase hex container ID")

// Process is a recorded process identity.
type Process struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Comm       string `json:"comm,omitempty"`
	// Escaped: a descendant of the tree outside its process group,
	// killed on its own (DESIGN "Descendants that leave the group").
	Escaped bool `json:"escaped,omitempty"`
}

// Tree is a supervisor tree as recorded at one point in time.
type Tree struct {
	PGID    int       `json:"pgid"`
	UID     int       `json:"uid"`
	Members []Process `json:"members"`
	// Withheld are descendants outside the group that were reported and
	// never signalled: another UID's, or carrying another container's ID.
	Withheld []Process `json:"withheld,omitempty"`
	Sockets  []string  `json:"sockets,omitempty"`
	// Source says who recorded it: "poststop", "reconcile" or "supervise".
	Source string    `json:"source"`
	SeenAt time.Time `json:"seen_at"`
	// Action and Error are the outcome of reaping it, when it was reaped
	// (action.Reaped, action.Gone, action.WouldNotDie), or why it was not
	// signalled (a skip).
	Action action.Action `json:"action,omitempty"`
	Error  string        `json:"error,omitempty"`
	// SocketsUnlinked lists the sockets removed after the tree died.
	SocketsUnlinked []string `json:"sockets_unlinked,omitempty"`
}

// Cgroup is a supervisor's cgroup (DESIGN "Descendants that leave the
// group") and what became of it. Its path is relative to the mount of its
// kind on this host, found again by whoever reaps it: the record never
// names an absolute path to write to.
type Cgroup struct {
	// Kind is "cgroup2", "freezer-v1" or "systemd".
	Kind string `json:"kind"`
	// Path is relative to the mount: kc-watchman/<id>, or the scope's
	// kc-watchman.slice/kc-watchman-<id>.scope.
	Path string `json:"path"`
	// Unit is the systemd scope, for kind "systemd".
	Unit string `json:"unit,omitempty"`
	// UID is the UID the contained tree runs as; a process in the cgroup
	// that does not run wholly as it (a setuid program) is reported,
	// never signalled.
	UID int `json:"uid"`
	// Outcome of the last sweep: action.Reaped, action.Gone,
	// action.WouldNotDie, or a skip when it was refused.
	Outcome action.Action `json:"outcome,omitempty"`
	// Withheld are processes found in it and never signalled.
	Withheld []Process `json:"withheld,omitempty"`
	// Removed: the emptied cgroup (or scope) is gone.
	Removed bool   `json:"removed,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Schema is the version of the record format this build writes. A record
// without one is from before versions were written (schema 0), and reads
// as this one. A record of a newer schema is refused, read and write: its
// meaning may have changed, and replacing it would lose what a newer hook
// recorded. Hence the upgrade order: kc-janitor first, then kc-hook.
const Schema = 1

// ErrNewerSchema is returned (wrapped) for a record written by a newer
// kc-watchman.
var ErrNewerSchema = errors.New("written by a newer kc-watchman")

// Record is everything known about one container.
type Record struct {
	Schema      int    `json:"schema"`
	ContainerID string `json:"container_id"`
	BootID      string `json:"boot_id"`
	Bundle      string `json:"bundle,omitempty"`
	// Init is the container's init process, recorded at createRuntime or
	// poststart (poststop is given no pid).
	Init *Process `json:"init,omitempty"`
	// Cgroups are the init's /proc/<pid>/cgroup lines when it was
	// recorded: the container's own cgroup, exactly (DESIGN "Ground truth must be corroborated").
	Cgroups []string `json:"cgroups,omitempty"`
	// Stages maps a hook stage to when it last ran.
	Stages map[string]time.Time `json:"stages,omitempty"`
	// Supervisor is the `kc-hook supervise` wrapper, when the hook
	// launched one.
	Supervisor *Process `json:"supervisor,omitempty"`
	// Trees is the latest snapshot of the container's supervisor trees.
	Trees []Tree `json:"trees,omitempty"`
	// Cgroup is the cgroup the wrapper started the supervisor in, when it
	// could contain it. An optional field a reader of an older build
	// ignores (it then reaps the groups only, as before): no schema bump.
	Cgroup *Cgroup `json:"cgroup,omitempty"`
	// Outcome summarises the last poststop: "reaped", "nothing",
	// "would-not-die" or "partial".
	Outcome   string    `json:"outcome,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Store is a ledger directory.
type Store struct {
	dir    string // <state-dir>/containers
	bootID string
}

// Open prepares <stateDir>/containers (mode 0700) and reads the boot ID.
// A state dir created here is made 0700; an existing one keeps its mode
// (a mistaken --state-dir=/run must not make /run root-only) but must be
// this UID's and closed to others (checkTrusted), or nothing is touched
// in it; so must the containers directory, which is then made 0700.
func Open(stateDir string) (*Store, error) {
	if err := MakeStateDir(stateDir); err != nil {
		return nil, err
	}
	if err := checkTrusted(stateDir); err != nil {
		return nil, err
	}
	if err := checkParents(stateDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "containers")
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating ledger directory: %w", err)
	}
	// One that others could write may hold their records already:
	// refused, not closed and used.
	if err := checkTrusted(dir); err != nil {
		return nil, err
	}
	// Mkdir leaves an existing directory's mode alone (0755 is trusted
	// too); through a descriptor of the directory itself, never a
	// symlink's target.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ledger directory: %w", err)
	}
	err = unix.Fchmod(fd, 0o700)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("securing ledger directory: %w", err)
	}
	boot, err := fingerprint.BootID()
	if err != nil {
		return nil, err
	}
	return &Store{dir: dir, bootID: boot}, nil
}

// MakeStateDir makes stateDir as Open does when it is missing (see
// makeStateDir), and does nothing when it exists: for what else a
// process writes there (kc-hook's log) before the ledger is opened.
func MakeStateDir(stateDir string) error {
	if _, err := os.Lstat(stateDir); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return makeStateDir(stateDir)
}

// makeStateDir makes a missing state dir, 0700, and the directories
// above it that are missing, once those that exist are trusted
// (checkParents' rule): nothing is made or chmodded through a directory
// or symlink another user could change.
func makeStateDir(stateDir string) error {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return fmt.Errorf("ledger directory: %w", err)
	}
	have := filepath.Dir(abs)
	for have != "/" {
		if _, err := os.Lstat(have); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		have = filepath.Dir(have)
	}
	if err := checkDirAbove(have); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	// Judged again: what MkdirAll found made meanwhile is not its own.
	if err := checkParents(abs); err != nil {
		return err
	}
	if err := unix.Mkdir(abs, 0o700); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil // someone's since: checkTrusted judges it
		}
		return fmt.Errorf("creating state directory: %w", err)
	}
	// The umask may have taken bits; set through the directory made,
	// never a symlink put in its place since.
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("securing state directory: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("securing state directory: %w", err)
	}
	return nil
}

// CheckDir applies Open's rules for a state dir that already exists
// (trusted, and its parents) without making anything: what else goes in
// it (kc-hook's log) is not written where the ledger would not be.
func CheckDir(stateDir string) error {
	if err := checkTrusted(stateDir); err != nil {
		return err
	}
	return checkParents(stateDir)
}

// checkTrusted refuses a ledger another user could write or swap: its
// records name processes to kill, and one planted there would have a
// stranger's group taken for a container's tree. The state dir and its
// containers directory must be directories (not symlinks) of this UID
// that nobody else may write, as LockApply wants the state dir; an error
// matches trust.ErrUntrusted.
func checkTrusted(dirs ...string) error {
	euid := uint32(os.Geteuid())
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return fmt.Errorf("ledger directory: %w", err)
		}
		if err := trust.Stat(d, &st, unix.S_IFDIR, false, euid); err != nil {
			return fmt.Errorf("ledger not used: %w (others could plant records naming processes to kill; it must be a directory of UID %d that others may not write, e.g. mode 0700)", err, euid)
		}
	}
	return nil
}

// checkParents refuses a state dir whose parents another user could
// change, renaming the state dir away and putting his own in its place:
// every directory above must be root's or this UID's and closed to
// others, or sticky (trust.Path). In a user namespace (a rootless
// podman's hook) the parents' owners are unmapped, shown as the overflow
// UID, and cannot be judged: they are not.
func checkParents(stateDir string) error {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return fmt.Errorf("ledger directory: %w", err)
	}
	return checkDirAbove(filepath.Dir(abs))
}

// checkDirAbove applies checkParents' rule to dir, an absolute path, and
// every directory above it.
func checkDirAbove(dir string) error {
	if m, err := userns.Self(); err != nil || !m.Initial() {
		return nil
	}
	if _, err := trust.Path(dir, unix.S_IFDIR, 0, uint32(os.Geteuid())); err != nil {
		return fmt.Errorf("ledger not used: %w (another user could put a state dir of his in its place)", err)
	}
	return nil
}

// LayoutCache is where a caller with the ledger keeps the BPF program's
// layout for the rest of the boot (taskiter.LoadCached): in the ledger's
// own directory, which nobody else may write. "" for no ledger.
func LayoutCache(s *Store) string {
	if s == nil {
		return ""
	}
	return filepath.Join(s.dir, "taskiter-layout")
}

// OpenReadOnly opens an existing ledger without creating anything.
func OpenReadOnly(stateDir string) (*Store, error) {
	dir := filepath.Join(stateDir, "containers")
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("ledger directory: %w", err)
	}
	if err := checkTrusted(stateDir, dir); err != nil {
		return nil, err
	}
	if err := checkParents(stateDir); err != nil {
		return nil, err
	}
	boot, err := fingerprint.BootID()
	if err != nil {
		return nil, err
	}
	return &Store{dir: dir, bootID: boot}, nil
}

// SupervisorLog is where a container's `kc-hook supervise` wrapper (and its
// command) write: <state-dir>/supervisors/<container-id>.log. It belongs
// to the container's record and goes with it.
func SupervisorLog(stateDir, containerID string) string {
	return filepath.Join(stateDir, "supervisors", containerID+".log")
}

// Dir returns the directory holding the records.
func (s *Store) Dir() string { return s.dir }

// CurrentBootID returns the boot ID records are stamped with.
func (s *Store) CurrentBootID() string { return s.bootID }

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+".json") }

// lock serialises the writers of id's record: ".lock" shared, then one
// of 16 stripe locks (".lock-<first hex digit of the ID>") exclusive.
// One exclusive lock for the whole ledger made a drain's records, each
// written before and after its reap, wait for one another
// (a burst of 51 reaps came out 30 ms apart). A writer that takes
// ".lock" exclusive (an older kc-hook, during an upgrade) still excludes
// every other. The files are fixed, so none is ever unlinked while
// another process waits on it.
func (s *Store) lock(id string) (func(), error) {
	deadline := time.Now().Add(LockTimeout)
	all, err := s.flock(".lock", unix.LOCK_SH, deadline)
	if err != nil {
		return nil, err
	}
	one, err := s.flock(".lock-"+id[:1], unix.LOCK_EX, deadline)
	if err != nil {
		all()
		return nil, err
	}
	return func() { one(); all() }, nil
}

// flock takes how on the lock file name, waiting until deadline at most:
// a holder that was stopped (SIGSTOP, Ctrl-Z) must not hang every hook
// until the runtime's timeout fails container starts.
func (s *Store) flock(name string, how int, deadline time.Time) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, name), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening ledger lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking ledger: %w", err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("ledger held by another process for %v: %w", LockTimeout, ErrLocked)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() { f.Close() }, nil // closing releases the flock
}

// Load reads one record. A missing record is fs.ErrNotExist.
func (s *Store) Load(id string) (*Record, error) {
	if !containerid.Valid(id) {
		return nil, ErrBadID
	}
	return s.load(s.path(id))
}

func (s *Store) load(path string) (*Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("ledger record %s: %w", filepath.Base(path), err)
	}
	if r.Schema > Schema {
		return nil, fmt.Errorf("ledger record %s: %w (schema %d; this one reads up to %d): upgrade kc-janitor and kc-hook, janitor first", filepath.Base(path), ErrNewerSchema, r.Schema, Schema)
	}
	if !containerid.Valid(r.ContainerID) || filepath.Base(path) != r.ContainerID+".json" {
		return nil, fmt.Errorf("ledger record %s: container id %q does not match its file name", filepath.Base(path), r.ContainerID)
	}
	return &r, nil
}

// Update applies fn to the record of id (a fresh one stamped with the
// current boot if none exists, or if the existing one is from another boot)
// and writes the result atomically. fn returning an error aborts the write.
func (s *Store) Update(id string, fn func(*Record) error) error {
	if !containerid.Valid(id) {
		return ErrBadID
	}
	unlock, err := s.lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	r, err := s.load(s.path(id))
	if errors.Is(err, ErrNewerSchema) {
		return err // never overwritten by an older writer
	}
	if err != nil || r.BootID != s.bootID {
		// An unreadable record is replaced rather than blocking the hook
		// forever; it could only have been written by a broken writer.
		r = &Record{ContainerID: id}
	}
	r.BootID = s.bootID
	if err := fn(r); err != nil {
		return err
	}
	r.UpdatedAt = time.Now().UTC()
	return s.write(r)
}

func (s *Store) write(r *Record) error {
	r.Schema = Schema
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding ledger record: %w", err)
	}
	data = append(data, '\n')
	return atomicfile.Write(s.dir, ".tmp-"+r.ContainerID+"-*", s.path(r.ContainerID), data, 0o600, "ledger record")
}

// listWorkers bounds the goroutines List reads records on. Every run
// reads the whole ledger, which holds each live container and, through
// weeks of dry runs, each container of the retention: a busy host's
// thousands of records, a file and a JSON decode each.
const listWorkers = 4

// List returns every readable record, in name order, and one error per
// record that could not be read. Temporary files are skipped.
func (s *Store) List() ([]*Record, []error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{fmt.Errorf("reading ledger directory: %w", err)}
	}
	var names []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".json") && containerid.Valid(strings.TrimSuffix(name, ".json")) {
			names = append(names, name)
		}
	}
	read := make([]*Record, len(names))
	failed := make([]error, len(names))
	workers := min(listWorkers, runtime.GOMAXPROCS(0), (len(names)+63)/64)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(names); i += workers {
				read[i], failed[i] = s.load(filepath.Join(s.dir, names[i]))
			}
		})
	}
	wg.Wait()
	var recs []*Record
	var errs []error
	for i, r := range read {
		switch err := failed[i]; {
		case err == nil:
			recs = append(recs, r)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	return recs, errs
}

// Current reports whether r was written during this boot. Records from
// another boot name processes that no longer exist; they must never be
// used to signal anything.
func (s *Store) Current(r *Record) bool { return r.BootID == s.bootID }

// Remove deletes the record of id, under the lock, if keep returns false
// for its current contents. It returns whether the record was removed.
func (s *Store) Remove(id string, keep func(*Record) bool) (bool, error) {
	if !containerid.Valid(id) {
		return false, ErrBadID
	}
	unlock, err := s.lock(id)
	if err != nil {
		return false, err
	}
	defer unlock()
	r, err := s.load(s.path(id))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, ErrNewerSchema):
		return false, nil // a newer writer's: not ours to judge
	case err != nil:
		r = nil // unreadable: nothing in it to keep
	}
	if r != nil && keep != nil && keep(r) {
		return false, nil
	}
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("removing ledger record: %w", err)
	}
	if err := removeNoFollow(SupervisorLog(filepath.Dir(s.dir), id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("removing supervisor log: %w", err)
	}
	return true, nil
}

// removeNoFollow unlinks path's last element relative to its directory,
// opened without following a symlink there: a supervisors/ that someone
// replaced with a symlink (in a state dir others can write, which doctor
// warns about) must not make the janitor delete <id>.log elsewhere.
func removeNoFollow(path string) error {
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fs.ErrNotExist
		}
		return &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(dir)
	if err := unix.Unlinkat(dir, filepath.Base(path), 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fs.ErrNotExist
		}
		return &os.PathError{Op: "unlink", Path: path, Err: err}
	}
	return nil
}

// RemoveStaleTemps deletes temporary files left by writers that were
// killed mid-write and are older than minAge.
func (s *Store) RemoveStaleTemps(minAge time.Duration) int {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < minAge {
			continue
		}
		if os.Remove(filepath.Join(s.dir, e.Name())) == nil {
			n++
		}
	}
	return n
}
