package fingerprint

import (
	"bytes"
	"errors"
	"fmt"
)

// DefaultRoot is where the host's procfs is mounted.
const DefaultRoot = "/proc"

// Identity is everything kc-watchman knows about one process.
type Identity struct {
	Stat
	TGID int
	UID  int // real UID
	// EUID and SUID are the effective and saved UIDs: a setuid program
	// keeps its caller's real UID, and only these say it runs as another.
	EUID, SUID int
	Argv       []string
}

// RunsAs reports whether uid is the process's real, effective and saved
// UID alike: only then is it wholly that user's.
func (id Identity) RunsAs(uid int) bool {
	return uid >= 0 && SoleUID([3]int{id.UID, id.EUID, id.SUID}) == uid
}

// SoleUID is the UID a process runs as wholly, given its real, effective
// and saved UIDs (ReadUIDs), or -1 when they differ (a setuid program).
func SoleUID(ids [3]int) int {
	if ids[1] != ids[0] || ids[2] != ids[0] {
		return -1
	}
	return ids[0]
}

// Same reports whether a and b describe the same process: equal PID and
// equal start time. PIDs are recycled; the pair is not (within one boot).
func Same(a, b Stat) bool {
	return a.PID == b.PID && a.StartTicks == b.StartTicks
}

// Read reads the full identity of pid. It fails with ErrNotFound when the
// process does not exist and with ErrNotProcess when pid is a thread ID of
// another process. A zombie is returned without error; callers decide what
// a zombie means (for liveness it means dead, see Alive).
func Read(root string, pid int) (Identity, error) {
	return ReadFrom(Dir(root), pid)
}

// ReadFrom is Read through f: stat, then ReadSince with the start time it
// shows (a PID recycled between the reads shows another one).
func ReadFrom(f Files, pid int) (Identity, error) {
	st, err := ReadStatFrom(f, pid)
	if err != nil {
		return Identity{Stat: st}, err
	}
	return ReadSince(f, pid, st.StartTicks)
}

// ReadSince reads the identity of pid for a process seen (listed, or
// read) started at start: status (Tgid and Uid: a thread ID is not a
// process), cmdline, then stat. A stat that still shows that start time
// proves status and cmdline were that process's (a PID and a start time
// are never reused together within a boot); any other start time reads as
// the process gone (ErrNotFound).
func ReadSince(f Files, pid int, start uint64) (Identity, error) {
	var id Identity
	tgid, ids, err := readStatus(f, pid)
	if err != nil {
		return id, err
	}
	id.TGID, id.UID, id.EUID, id.SUID = tgid, ids[0], ids[1], ids[2]
	if id.TGID != pid {
		return id, fmt.Errorf("pid %d (thread of %d): %w", pid, id.TGID, ErrNotProcess)
	}
	data, err := f.ReadFile(pid, "cmdline")
	if err != nil {
		return id, err
	}
	id.Argv = SplitArgv(data)
	if id.Stat, err = ReadStatFrom(f, pid); err != nil {
		return id, err
	}
	if id.StartTicks != start {
		return id, fmt.Errorf("pid %d is not the process seen at %d ticks any more (recycled): %w", pid, start, ErrNotFound)
	}
	return id, nil
}

// ReadArgv returns the NUL-separated argv of pid. Kernel threads and
// zombies have an empty argv.
func ReadArgv(root string, pid int) ([]string, error) {
	data, err := Dir(root).ReadFile(pid, "cmdline")
	if err != nil {
		return nil, err
	}
	return SplitArgv(data), nil
}

// SplitArgv splits raw /proc/<pid>/cmdline contents.
func SplitArgv(data []byte) []string {
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return nil
	}
	parts := bytes.Split(data, []byte{0})
	argv := make([]string, len(parts))
	for i, p := range parts {
		argv[i] = string(p)
	}
	return argv
}

// Alive reports whether the process described by want still exists with
// the same identity, is a process (not a thread) and is not a zombie.
func Alive(root string, want Stat) bool {
	st, err := Revalidate(root, want)
	return err == nil && !st.Zombie()
}

// Running reports whether a process that has not exited holds pid,
// whichever process it is; a stat that cannot be read for another reason
// than the process's absence counts as running (the safe answer for a
// caller about to decide something is gone).
func Running(root string, pid int) bool {
	st, err := ReadStat(root, pid)
	if err != nil {
		return !errors.Is(err, ErrNotFound)
	}
	return !st.Zombie()
}

// ErrRecycled is returned (wrapped) when a PID now belongs to another
// process than the one recorded.
var ErrRecycled = errors.New("pid now belongs to another process")

// Revalidate re-reads pid's stat and checks it is still the recorded
// process: same start time, and a process rather than a thread (a thread
// created later can carry the recorded number). It returns the fresh stat.
func Revalidate(root string, want Stat) (Stat, error) {
	st, err := ReadStat(root, want.PID)
	if err != nil {
		return st, err
	}
	if st.StartTicks != want.StartTicks {
		return st, fmt.Errorf("pid %d: start %d, recorded %d: %w", want.PID, st.StartTicks, want.StartTicks, ErrRecycled)
	}
	tgid, err := readTGID(root, want.PID)
	if err != nil {
		return st, err
	}
	if tgid != want.PID {
		return st, fmt.Errorf("pid %d (thread of %d): %w", want.PID, tgid, ErrNotProcess)
	}
	return st, nil
}

func readTGID(root string, pid int) (int, error) {
	tgid, _, err := readStatus(Dir(root), pid)
	return tgid, err
}
