package ledger

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// A hook that cannot write its state dir has nowhere to say so: runc
// discards the stderr of a hook that exits 0, and the log lives in the
// state dir. It appends one line to a trace file instead, where the user
// (and doctor) look for it: the user's runtime dir, else the temp dir,
// both named for the host UID the hook runs as.

// TraceEntry is one line of the trace file.
type TraceEntry struct {
	Time      time.Time `json:"time"`
	Container string    `json:"container,omitempty"`
	Stage     string    `json:"stage,omitempty"`
	HostUID   int       `json:"host_uid"`
	StateDir  string    `json:"state_dir"`
	Error     string    `json:"error"`
}

// traceLimit bounds a trace file: past it, the file starts over.
const traceLimit = 256 << 10

// TraceFiles are where a hook running as hostUID leaves its trace, in
// order of preference. The last is in /tmp, not $TMPDIR: the hook runs
// with the descriptor's environment (PATH alone), and doctor, which reads
// the same list in an operator's shell, must look where it wrote.
func TraceFiles(hostUID int) []string {
	tmp := filepath.Join("/tmp", "kc-hook-"+strconv.Itoa(hostUID)+".trace")
	if hostUID == 0 {
		return []string{RootStateDir + ".trace", tmp}
	}
	return []string{filepath.Join(UserRuntimeDir(hostUID), "kc-hook.trace"), tmp}
}

// WriteTrace appends e to the first trace file that can be written safely
// (a regular file of the caller's own that only it may write, reached
// without following a symlink) and returns its path.
func WriteTrace(files []string, e TraceEntry) (string, error) {
	line, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	line = append(line, '\n')
	var errs []error
	for _, p := range files {
		if err := appendTrace(p, line); err != nil {
			errs = append(errs, err)
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("no trace file could be written: %w", errors.Join(errs...))
}

func appendTrace(path string, line []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// In a shared temp dir, someone else's file under this name is not
	// ours to write, nor is one others may write lines into.
	if err := trust.Stat(path, &st, unix.S_IFREG, false, uint32(os.Geteuid())); err != nil {
		return err
	}
	if st.Nlink != 1 {
		// A hard link another user made (where protected_hardlinks is
		// off) to a file of ours elsewhere, a binary maybe: writing it,
		// or emptying it past the limit, would be writing that file.
		return fmt.Errorf("%s has %d names: a file of ours linked there, not written", path, st.Nlink)
	}
	if st.Size > traceLimit {
		// Cut under the file's lock, the size read again there: two
		// hooks that both saw it over the limit would otherwise cut it
		// twice, the second time the first one's line. Whoever does not
		// get the lock at once just appends.
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			if unix.Fstat(fd, &st) == nil && st.Size > traceLimit {
				if err := f.Truncate(0); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
			}
			defer unix.Flock(fd, unix.LOCK_UN) //nolint:errcheck // closing drops it too
		}
	}
	if _, err := f.Write(line); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadTrace returns the entries of the trace files written at or after
// since, oldest first, and the files they came from. It reads only what
// WriteTrace would have written: a regular file of the caller's own that
// only it may write, reached without following a symlink. The names are
// in the temp dir, where anyone may put a FIFO (which would hold the
// open) or a file of their own saying anything.
func ReadTrace(files []string, since time.Time) ([]TraceEntry, []string) {
	var out []TraceEntry
	var from []string
	for _, p := range files {
		n := len(out)
		out = readTrace(p, since, out)
		if len(out) > n {
			from = append(from, p)
		}
	}
	return out, from
}

func readTrace(path string, since time.Time, out []TraceEntry) []TraceEntry {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return out
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || trust.Stat(path, &st, unix.S_IFREG, false, uint32(os.Geteuid())) != nil || st.Nlink != 1 {
		return out // as appendTrace: a file of ours linked there is not a trace
	}
	sc := bufio.NewScanner(io.LimitReader(f, traceLimit*2))
	for sc.Scan() {
		var e TraceEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil && !e.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}
