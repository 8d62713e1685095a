package janitor

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/logkeys"
)

// Log says where and how the janitor logs.
type Log struct {
	JSON  bool
	Level slog.Level
	// File, when set, gets every record at info or above too.
	File string
}

// NewLogger logs to stderr at l.Level and, when l.File is set, to that
// file too, at info or below whatever stderr gets: the file is the audit
// record of every run. The file's directory must exist: a typo in a cron
// line must fail, not grow a directory tree somewhere. When stderr is the journal (JOURNAL_STREAM set), its lines carry no
// time: journald stamps them. The returned closer closes the file.
func NewLogger(l Log) (*slog.Logger, func(), error) {
	logFile := l.File
	stderr := newHandler(l.JSON, os.Stderr, l.Level, os.Getenv("JOURNAL_STREAM") != "")
	closer := func() {}
	if logFile == "" {
		return slog.New(logkeys.Unique(stderr)), closer, nil
	}
	f, err := openLogFile(logFile)
	if err != nil {
		return nil, nil, err
	}
	closer = func() { f.Close() }
	file := newHandler(l.JSON, f, min(l.Level, slog.LevelInfo), false)
	return slog.New(logkeys.Unique(slog.NewMultiHandler(stderr, file))), closer, nil
}

// newHandler is a text or JSON handler writing records at level or above.
// Durations are written as Go durations ("1m30s") in text and as seconds
// in JSON, never as nanoseconds.
func newHandler(json bool, w io.Writer, level slog.Level, noTime bool) slog.Handler {
	opts := &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if noTime && len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			if a.Value.Kind() == slog.KindDuration {
				d := a.Value.Duration()
				if json {
					return slog.Float64(a.Key+"_seconds", d.Seconds())
				}
				return slog.String(a.Key, d.String())
			}
			return a
		},
	}
	if json {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// openLogFile opens path for appending, creating the file (0640) but never
// its directory. A log in a directory others may write (a seed's
// ./kc-sweeper.log, /tmp) is theirs to plant things at: a symlink is not
// followed (root would append to its target), a FIFO not waited on, and
// what is opened must be a regular file of ours with no other link, or
// a device (/dev/null), which only root can make.
func openLogFile(path string) (*os.File, error) {
	if st, err := os.Stat(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("log file %s: its directory cannot be used (create it first): %w", path, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("log file %s: %s is not a directory", path, filepath.Dir(path))
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o640)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = fmt.Errorf("%w (a symlink is not followed)", err)
		}
		return nil, fmt.Errorf("cannot open log file %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cannot open log file %s: %w", path, err)
	}
	var why string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Uid != uint32(os.Geteuid()) {
			why = fmt.Sprintf("owned by uid %d, not this user", st.Uid)
		} else if st.Nlink != 1 {
			why = fmt.Sprintf("it has %d links", st.Nlink)
		}
	case unix.S_IFCHR:
		if st.Uid != 0 {
			why = "a device not root's"
		}
	default:
		why = "not a regular file"
	}
	if why != "" {
		unix.Close(fd)
		return nil, fmt.Errorf("log file %s not used: %s", path, why)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// AppendFailure writes one ERROR record to l.File (and nowhere else): the
// audit line of a run that failed before or after its own logging, so that
// a week of a cron job's log never reads silence for a failed run. A file
// that cannot be opened is returned as an error for the caller to say on
// stderr; the run's exit code stands.
func AppendFailure(l Log, cmd string, attrs ...any) error {
	if l.File == "" {
		return nil
	}
	f, err := openLogFile(l.File)
	if err != nil {
		return err
	}
	defer f.Close()
	slog.New(newHandler(l.JSON, f, slog.LevelInfo, false)).Error("run failed", append([]any{"cmd", cmd}, attrs...)...)
	return nil
}
