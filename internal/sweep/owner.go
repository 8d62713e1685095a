package sweep

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// say is one gate's opinion.
type say int8

const (
	sayUnsure say = iota // the gate could not tell
	sayStale             // the gate finds the socket orphaned
	sayLive              // the gate finds a live supervisor behind it
)

func (s say) String() string {
	switch s {
	case sayStale:
		return "stale"
	case sayLive:
		return "live"
	}
	return "unsure"
}

// ticksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's starttime. It
// is 100 on every Linux ABI.
const ticksPerSecond = 100

// startSlack absorbs rounding between a process's start time (10 ms ticks)
// and a file's timestamps. A process counts as started after its socket
// only when it started more than this after the socket last changed.
const startSlack = time.Second

// bootEpoch returns the wall-clock time of boot, to the nanosecond, in the
// clock /proc/<pid>/stat's starttime counts in (CLOCK_BOOTTIME).
func bootEpoch() (time.Time, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, err
	}
	return time.Now().Add(-time.Duration(ts.Nano())), nil
}

// pidView maps PIDs as written in socket names (PIDs in the PID namespace
// of whoever created the socket) to host PIDs.
//
// On the host the mapping is the identity. For a container, the name
// carries a PID of the container's PID namespace, and /proc/<that pid> on
// the host may be an unrelated process. The view is built once from the
// host's /proc: every process whose /proc/<pid>/ns/pid is the container
// init's PID namespace lists its PID in that namespace as the last field
// of NSpid in /proc/<pid>/status. Only processes (thread-group leaders)
// are listed in /proc, so a thread ID of the container never maps to
// anything, which is the right answer: it is not a process. (The
// container's own /proc is not used: it may be absent or be whatever the
// container mounted there.)
type pidView struct {
	procRoot  string
	container bool
	hostOf    map[int]int // container PID -> host PID
	// ns is the container's PID namespace (readlink of ns/pid); indexed
	// says hostOf came from an NSIndex and each entry is checked at use.
	ns      string
	indexed bool
	// unread is why the last walk could not place a process it listed
	// (not gone, not another user's): a PID it did not map may be that
	// one's, so it is not proof that the owner is dead.
	unread error
	// mu guards hostOf and indexed: the probes judge owners
	// concurrently, and a miss replaces the map.
	mu sync.Mutex
}

func hostView(procRoot string) *pidView { return &pidView{procRoot: procRoot} }

// containerView builds the view of initPID's PID namespace, from idx
// when it has one of it (nil: walk /proc).
func containerView(procRoot string, initPID int, idx *NSIndex) (*pidView, error) {
	want, err := os.Readlink(procRoot + "/" + strconv.Itoa(initPID) + "/ns/pid")
	if err != nil {
		return nil, fmt.Errorf("container init %d: %w", initPID, err)
	}
	self, err := os.Readlink(procRoot + "/self/ns/pid")
	if err == nil && self == want {
		// The container shares our PID namespace (--pid=host).
		return hostView(procRoot), nil
	}
	if idx != nil {
		if ps, err := idx.of(procRoot, want); err == nil {
			v := &pidView{procRoot: procRoot, container: true, hostOf: make(map[int]int, len(ps)), ns: want, indexed: true}
			for _, p := range ps {
				v.hostOf[p.inner] = p.host
			}
			// The index is of the container's init as it is now, or
			// of nothing (a container restarted since has another
			// namespace).
			if ok, err := stillIn(procRoot, initPID, 1, want); ok && err == nil && v.hostOf[1] == initPID {
				return v, nil
			}
		}
	}
	v := &pidView{procRoot: procRoot, container: true, ns: want}
	if err := v.walk(); err != nil {
		return nil, err
	}
	if _, ok := v.hostOf[1]; !ok {
		return nil, fmt.Errorf("container init %d: no process found in its PID namespace", initPID)
	}
	return v, nil
}

// walk fills the view from a walk of /proc: one readlink per process.
func (v *pidView) walk() error {
	ents, err := os.ReadDir(v.procRoot)
	if err != nil {
		return err
	}
	hostOf := map[int]int{}
	var unread error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		base := v.procRoot + "/" + e.Name()
		ns, err := os.Readlink(base + "/ns/pid")
		if err != nil {
			if err := v.unplaced(pid, base, err); err != nil {
				unread = err
			}
			continue
		}
		if ns != v.ns {
			continue
		}
		inner, ok := nsPID(base + "/status")
		if !ok {
			if err := v.unplaced(pid, base, fmt.Errorf("no NSpid in %s/status", base)); err != nil {
				unread = err
			}
			continue
		}
		hostOf[inner] = pid
	}
	v.hostOf, v.indexed, v.unread = hostOf, false, unread
	return nil
}

// hostPIDs are the host PIDs of the container's processes; from an
// index, only those still in the namespace with the PID it listed.
func (v *pidView) hostPIDs() []int {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []int
	for inner, h := range v.hostOf {
		if !v.indexed {
			out = append(out, h)
		} else if ok, err := stillIn(v.procRoot, h, inner, v.ns); ok && err == nil {
			out = append(out, h)
		}
	}
	return out
}

// nsPID returns the innermost PID from the NSpid line of a status file.
func nsPID(statusPath string) (int, bool) {
	f, err := os.Open(statusPath)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	// NSpid comes after Groups, which for a process of 65536 groups (a
	// user namespace's setgroups allows as many) is some 700 KB.
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("NSpid:")); ok {
			fields := bytes.Fields(rest)
			if len(fields) == 0 {
				return 0, false
			}
			n, err := strconv.Atoi(string(fields[len(fields)-1]))
			return n, err == nil
		}
	}
	return 0, false
}

// hostPID maps a PID from a socket name to a host PID. A view from an
// index that lacks the PID, or maps it to a process no longer that one,
// walks /proc first: the index is older than the sweep. err is why the
// walk failed, or why a PID it did not map may be the container's all
// the same (a process it could not read).
func (v *pidView) hostPID(pid int) (int, bool, error) {
	if !v.container {
		return pid, true, nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	h, ok := v.hostOf[pid]
	if !v.indexed {
		return h, ok, v.missed(ok)
	}
	if ok {
		still, err := stillIn(v.procRoot, h, pid, v.ns)
		if err != nil {
			return 0, false, fmt.Errorf("checking host pid %d: %w", h, err)
		}
		if still {
			return h, true, nil
		}
	}
	if err := v.walk(); err != nil {
		return 0, false, fmt.Errorf("listing the container's processes: %w", err)
	}
	h, ok = v.hostOf[pid]
	return h, ok, v.missed(ok)
}

// unplaced is err, the reason the walk could not place process pid, when
// that process may be a live one of the container: nil when it is gone or
// a zombie (its namespace links go first), or another user's (not
// inspectable, and never in a namespace of ours).
func (v *pidView) unplaced(pid int, base string, err error) error {
	if errors.Is(err, fs.ErrPermission) || unlessGone(base, err) == nil {
		return nil
	}
	if st, serr := fingerprint.ReadStat(v.procRoot, pid); errors.Is(serr, fingerprint.ErrNotFound) || serr == nil && st.Zombie() {
		return nil
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// missed is why a PID the last walk did not map may still be a live
// process of the container: nil when the walk placed every process it
// listed.
func (v *pidView) missed(mapped bool) error {
	if mapped || v.unread == nil {
		return nil
	}
	return fmt.Errorf("a process of the container could not be read (%w): the PID may be its", v.unread)
}

// ownerGate is gate 1: is the socket's named owner a live supervisor that
// could have created it? uid is the socket file's owner.
func ownerGate(v *pidView, pid, uid int, comms []string, changed, boot time.Time) (say, string) {
	host, ok, err := v.hostPID(pid)
	if err != nil {
		return sayUnsure, err.Error()
	}
	if !ok {
		return sayStale, fmt.Sprintf("no process %d in the container", pid)
	}
	id, err := fingerprint.Read(v.procRoot, host)
	return judgeOwner(pid, host, uid, v.container, id, err, comms, changed, boot)
}

// judgeOwner is gate 1's decision on what /proc said about the owner.
func judgeOwner(pid, host, uid int, container bool, id fingerprint.Identity, err error, comms []string, changed, boot time.Time) (say, string) {
	who := "pid " + strconv.Itoa(pid)
	if container {
		who += " (host pid " + strconv.Itoa(host) + ")"
	}
	switch {
	case errors.Is(err, fingerprint.ErrNotFound):
		return sayStale, "no process " + strconv.Itoa(pid)
	case errors.Is(err, fingerprint.ErrNotProcess):
		return sayStale, fmt.Sprintf("%s is a thread of process %d, not a process", who, id.TGID)
	case err != nil:
		return sayUnsure, fmt.Sprintf("cannot read %s: %v", who, err)
	case id.Zombie():
		return sayStale, fmt.Sprintf("%s (%s) is a zombie", who, id.Comm)
	case !slices.Contains(comms, id.Comm):
		return sayStale, fmt.Sprintf("%s is %q, not a supervisor (%s)", who, id.Comm, strings.Join(comms, ","))
	}
	start := boot.Add(time.Duration(id.StartTicks) * (time.Second / ticksPerSecond))
	if start.After(changed.Add(startSlack)) {
		return sayStale, fmt.Sprintf("%s (%s) started %s, after the socket was created %s: a recycled pid",
			who, id.Comm, start.Format(time.RFC3339), changed.Format(time.RFC3339))
	}
	if uid != id.UID && uid != id.EUID && uid != id.SUID {
		// Anyone may bind a free name in /tmp after the supervisor
		// started: a socket its process could not have made is not its
		// own, and what answers there speaks for someone else.
		return sayUnsure, fmt.Sprintf("%s is a live %s, but runs as uid %d and the socket is uid %d's: not its socket", who, id.Comm, id.UID, uid)
	}
	return sayLive, fmt.Sprintf("%s is a live %s", who, id.Comm)
}
