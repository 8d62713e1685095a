package sweep

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
)

// Dir is one socket directory (or pattern) a sweep looked in, as a path
// inside the target, and why it was looked in.
type Dir struct {
	Path string
	// Sources say where the directory came from: "--socket-dir" (given
	// by the operator), "default", "kcserver <pid> --socket-dir" (a live
	// kcserver's argv), "kcserver <pid> XDG_RUNTIME_DIR" (its
	// environment), "container init <pid> TMPDIR", … PIDs are host PIDs.
	Sources []string
	// Refused says why a directory learned from a process was not swept
	// (empty: it was, or it was not learned from a process).
	Refused string

	// discovered: learned from processes only, not given or a default;
	// owners are the UIDs of the processes that named it.
	discovered bool
	owners     []int
	err        error // why it was refused
}

// Where a kcserver puts its sockets (real kcserver 0.1.64): the control
// socket in --socket-dir, else $XDG_RUNTIME_DIR, else the temp dir
// ($TMPDIR, else /tmp), or at --unix-socket; session sockets in
// --socket-dir, else the temp dir. A sweep that only knew /tmp and
// /run/user/* would miss every other one of these.
var (
	socketFlags = []string{"--socket-dir", "--unix-socket"}
	socketEnv   = []string{"XDG_RUNTIME_DIR", "TMPDIR"}
)

// discoverDirs finds the socket directories of the live supervisors in
// view's PID namespace (their argv and environment) and, in a container,
// the directories its init's environment names. The paths are
// inside the target (the processes' own mount namespace is taken to be
// the init's). Relative paths and paths with glob characters are skipped:
// a directory learned from a process must name exactly one directory.
// Each is added to found with the UIDs of the processes that named it,
// which openDiscovered holds it to: anyone can start a process named
// kcserver.
func discoverDirs(view *pidView, target Target, comms []string, found *dirSet) {
	var pids []int
	// On the host, a process of another PID namespace (a pod's, a
	// container's) names directories whose sockets carry PIDs the host's
	// gate 1 cannot judge; its own sweep (--container) looks there.
	var ours string
	if !view.container {
		ours, _ = os.Readlink(view.procRoot + "/self/ns/pid")
	}
	if view.container {
		pids = view.hostPIDs()
	} else {
		pids = listPIDs(view.procRoot)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		// The name first: argv is read only of the few that may be
		// supervisors, not of every process on the host.
		if st, err := fingerprint.ReadStat(view.procRoot, pid); err != nil || st.Zombie() || !slices.Contains(comms, st.Comm) {
			continue
		}
		if ours != "" {
			if theirs, err := os.Readlink(view.procRoot + "/" + strconv.Itoa(pid) + "/ns/pid"); err != nil || theirs != ours {
				continue
			}
		}
		id, err := fingerprint.Read(view.procRoot, pid)
		if err != nil || id.TGID != pid || id.Zombie() || !slices.Contains(comms, id.Comm) {
			continue
		}
		who := fmt.Sprintf("%s %d", id.Comm, pid)
		for flag, val := range flagValues(id.Argv, socketFlags) {
			if flag == "--unix-socket" {
				val = filepath.Dir(val)
			}
			found.add(val, who+" "+flag, id.UID)
		}
		for k, v := range envValues(view.procRoot, pid, socketEnv) {
			found.add(v, who+" "+k, id.UID)
		}
	}
	// The init's own directories too, whatever else runs: any process
	// named kcserver in the container would otherwise switch them off.
	if target.Container() {
		if id, err := fingerprint.Read(view.procRoot, target.InitPID); err == nil {
			for k, v := range envValues(view.procRoot, target.InitPID, socketEnv) {
				found.add(v, fmt.Sprintf("container init %d %s", target.InitPID, k), id.UID)
			}
		}
	}
}

// Bounds on the directories learnt from processes: anyone can start
// processes named kcserver, each naming four directories, and every
// directory is listed (its share of maxNames sockets, shareOut) and its
// names judged.
const (
	maxDirsPerOwner   = 8
	maxDiscoveredDirs = 256
)

// dirSet gathers the directories processes name, at most
// maxDirsPerOwner new ones per user and maxDiscoveredDirs in all; a
// directory already named takes further sources and owners, and one the
// sweep looks in anyway (a default) costs nothing.
type dirSet struct {
	// owner is the user a UID counts against (a rootless user's
	// subordinate UIDs are his).
	owner   func(uid int) int
	free    []string // patterns of the directories looked in anyway
	found   map[string]*Dir
	counted int // the directories found that are not free
	perUser map[int]int
	// perUserFree counts, per user, the free ones it named first.
	perUserFree map[int]int
	dropped     map[string]int // the directories left out, with the user who named each first
	droppedMore int            // and how many more, past maxDropped
}

func newDirSet(owner func(uid int) int, free []string) *dirSet {
	return &dirSet{owner: owner, free: free, found: map[string]*Dir{}, perUser: map[int]int{}, perUserFree: map[int]int{}, dropped: map[string]int{}}
}

func (s *dirSet) add(p, source string, uid int) {
	p = filepath.Clean(p)
	if !filepath.IsAbs(p) || hasMeta(p) {
		return
	}
	d := s.found[p]
	if d == nil {
		user := s.owner(uid)
		if s.isFree(p) {
			// Swept anyway, so not counted in all; still bounded per
			// user: /run/user/<any name> matches /run/user/*, and each
			// directory found is reported and walked.
			if s.perUserFree[user] >= maxDirsPerOwner {
				s.drop(p, user)
				return
			}
			s.perUserFree[user]++
		} else {
			if s.perUser[user] >= maxDirsPerOwner || s.counted >= maxDiscoveredDirs {
				s.drop(p, user)
				return
			}
			s.perUser[user]++
			s.counted++
		}
		d = &Dir{Path: p, discovered: true}
		s.found[p] = d
	}
	d.Sources = appendNew(d.Sources, source)
	if !slices.Contains(d.owners, uid) {
		d.owners = append(d.owners, uid)
	}
}

// drop notes p left out, named first by user; past maxDropped only
// counted.
func (s *dirSet) drop(p string, user int) {
	if _, ok := s.dropped[p]; ok {
		return
	}
	if len(s.dropped) >= maxDropped {
		s.droppedMore++
		return
	}
	s.dropped[p] = user
}

// maxDropped bounds the directories left out that are remembered by name.
const maxDropped = 1024

func (s *dirSet) isFree(p string) bool {
	for _, pat := range s.free {
		if ok, _ := filepath.Match(pat, p); ok {
			return true
		}
	}
	return false
}

// droppedNote sums up the directories left out for the log: how many, of
// how many users, and the first few of those users.
func (s *dirSet) droppedNote() (dirs, users int, some []int) {
	byUser := map[int]bool{}
	for _, u := range s.dropped {
		byUser[u] = true
	}
	for u := range byUser {
		some = append(some, u)
	}
	slices.Sort(some)
	return len(s.dropped) + s.droppedMore, len(some), some[:min(len(some), 5)]
}

// dirs are the directories gathered, by path.
func (s *dirSet) dirs() []Dir {
	out := make([]Dir, 0, len(s.found))
	for _, d := range s.found {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func listPIDs(procRoot string) []int {
	ents, _ := os.ReadDir(procRoot)
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// flagValues returns the values argv gives the named long flags, clap's
// way: "--flag value" or "--flag=value" (the last one wins, as clap
// refuses repeats anyway).
func flagValues(argv []string, names []string) map[string]string {
	out := map[string]string{}
	for i := 1; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			break
		}
		for _, n := range names {
			switch {
			case a == n && i+1 < len(argv):
				out[n] = argv[i+1]
			case strings.HasPrefix(a, n+"="):
				out[n] = a[len(n)+1:]
			}
		}
	}
	return out
}

// envValues returns the named variables of pid's initial environment
// (/proc/<pid>/environ; empty values are left out). Unreadable: none.
func envValues(procRoot string, pid int, names []string) map[string]string {
	data, err := fingerprint.Dir(procRoot).ReadFile(pid, "environ")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte("="))
		if !ok || len(v) == 0 {
			continue
		}
		if slices.Contains(names, string(k)) {
			out[string(k)] = string(v)
		}
	}
	return out
}

// mergeDirs lists the patterns swept with where each came from: given
// ones first, then defaults, then discovered ones not already there.
func mergeDirs(given []string, givenSource string, found []Dir) []Dir {
	var out []Dir
	idx := map[string]int{}
	for _, p := range given {
		if i, ok := idx[p]; ok {
			out[i].Sources = appendNew(out[i].Sources, givenSource)
			continue
		}
		idx[p] = len(out)
		out = append(out, Dir{Path: p, Sources: []string{givenSource}})
	}
	for _, d := range found {
		if i, ok := idx[d.Path]; ok {
			for _, s := range d.Sources {
				out[i].Sources = appendNew(out[i].Sources, s)
			}
			continue
		}
		idx[d.Path] = len(out)
		out = append(out, d)
	}
	return out
}

// openAll opens the directories cfg says to sweep (the given ones, else
// the defaults and the discovered ones) and lists them in rep.Dirs. Given
// and default directories that cannot be opened are errors (a missing
// default is not); a discovered one that cannot be opened or fails
// openDiscovered's rules is refused, with a warning: a process anyone can
// start must not be able to fail the sweep. The guard it returns keeps
// the listing out of users' FUSE mounts too.
func openAll(cfg Config, view *pidView, rep *Report, owner func(uid int) int) ([]*dir, pathwalk.Guard) {
	given, source := cfg.Dirs, "--socket-dir"
	var found []Dir
	if len(cfg.Dirs) == 0 {
		given, source = cfg.defaultDirs, "default"
		set := newDirSet(owner, given)
		discoverDirs(view, cfg.Target, cfg.SupervisorComms, set)
		found = set.dirs()
		if n, users, some := set.droppedNote(); n > 0 {
			cfg.Logger.Warn("socket directories named by supervisors not swept: more than the bound per user or in all",
				"left_out", n, "users", users, "first_users", fmt.Sprint(some), "per_user", maxDirsPerOwner, "in_all", maxDiscoveredDirs)
		}
	}
	rep.Dirs = mergeDirs(given, source, found)
	var trusted []string
	for _, d := range rep.Dirs {
		if !d.discovered {
			trusted = append(trusted, d.Path)
		}
	}
	guard := pathwalk.ReadGuard(cfg.ProcRoot, cfg.Target.InitPID)
	if guard.Err() != nil {
		// A mount past what was read has the table read again whole; one
		// that cannot be judged is refused, and said so.
		cfg.Logger.Debug("mount table not read whole", "err", guard.Err())
	}
	dirs, errs := openDirs(cfg.Target, guard, trusted)
	for _, err := range errs {
		if len(cfg.Dirs) == 0 && isNotExist(err) {
			continue
		}
		var match globMatch
		// Not a table gone stale (it kept changing): that blinds every
		// directory alike, and is the run's failure, not one user's doing.
		if (len(cfg.Dirs) == 0 || errors.As(err, &match)) && (errors.Is(err, pathwalk.ErrOnFUSE) || errors.Is(err, pathwalk.ErrNewMount)) && !errors.Is(err, pathwalk.ErrTableStale) {
			// A user can mount over his own /run/user/<uid>: that must
			// not fail every sweep, default or --socket-dir '/run/user/*'.
			cfg.Logger.Warn("socket directory not swept", "why", err)
			continue
		}
		rep.DirErrors = append(rep.DirErrors, err)
	}
	seen := map[[2]uint64]bool{}
	for _, d := range dirs {
		seen[[2]uint64{d.dev, d.ino}] = true
	}
	for i := range rep.Dirs {
		rd := &rep.Dirs[i]
		if !rd.discovered {
			continue
		}
		d, err := openDiscovered(cfg.Target, guard, rd.Path, rd.owners)
		if err != nil {
			rd.Refused, rd.err = err.Error(), err
			if errors.Is(err, pathwalk.ErrTableStale) {
				rep.DirErrors = append(rep.DirErrors, err)
				continue
			}
			if !isNotExist(err) {
				cfg.Logger.Warn("socket directory named by a process refused", "dir", rd.Path,
					"sources", strings.Join(rd.Sources, ", "), "why", rd.Refused)
			}
			continue
		}
		if k := [2]uint64{d.dev, d.ino}; seen[k] {
			d.close()
		} else {
			seen[k] = true
			dirs = append(dirs, d)
		}
	}
	return dirs, guard
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
