package fingerprint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// DefaultRoot is where the host's procfs is mounted.
const DefaultRoot = "/proc"

// Identity is everything kc-watchman knows about one process.
type Identity struct {
	Stat
	TGID int
	UID  int // real UID
	Argv []string
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
	var id Identity
	st, err := ReadStat(root, pid)
	if err != nil {
		return id, err
	}
	id.Stat = st
	if err := readStatus(root, pid, &id); err != nil {
		return id, err
	}
	if id.TGID != pid {
		return id, fmt.Errorf("pid %d (thread of %d): %w", pid, id.TGID, ErrNotProcess)
	}
	argv, err := ReadArgv(root, pid)
	if err != nil {
		return id, err
	}
	id.Argv = argv
	// A PID recycled between the reads would show a different start time.
	again, err := ReadStat(root, pid)
	if err != nil {
		return id, err
	}
	if again.StartTicks != st.StartTicks {
		return id, fmt.Errorf("pid %d was recycled while being read: %w", pid, ErrNotFound)
	}
	return id, nil
}

// readStatus fills TGID and UID from /proc/<pid>/status.
func readStatus(root string, pid int, id *Identity) error {
	f, err := os.Open(procPath(root, pid, "status"))
	if err != nil {
		return notFound(pid, err)
	}
	defer f.Close()
	id.TGID, id.UID = -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("Tgid:")):
			id.TGID, err = firstInt(line[len("Tgid:"):])
		case bytes.HasPrefix(line, []byte("Uid:")):
			id.UID, err = firstInt(line[len("Uid:"):])
		}
		if err != nil {
			return fmt.Errorf("pid %d: status: %w", pid, err)
		}
		if id.TGID >= 0 && id.UID >= 0 {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return notFound(pid, err)
	}
	return fmt.Errorf("pid %d: status lacks Tgid or Uid: %w", pid, ErrMalformed)
}

func firstInt(b []byte) (int, error) {
	f := bytes.Fields(b)
	if len(f) == 0 {
		return 0, fmt.Errorf("%w: empty field", ErrMalformed)
	}
	v, err := strconv.Atoi(string(f[0]))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return v, nil
}

// ReadArgv returns the NUL-separated argv of pid. Kernel threads and
// zombies have an empty argv.
func ReadArgv(root string, pid int) ([]string, error) {
	data, err := os.ReadFile(procPath(root, pid, "cmdline"))
	if err != nil {
		return nil, notFound(pid, err)
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
	var id Identity
	if err := readStatus(root, pid, &id); err != nil {
		return 0, err
	}
	return id.TGID, nil
}

func isESRCH(err error) bool {
	return errors.Is(err, syscall.ESRCH)
}
