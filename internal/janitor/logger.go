package janitor

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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
// record of every run. Missing parent directories of the file are created.
// When stderr is the journal (JOURNAL_STREAM set), its lines carry no
// time: journald stamps them. The returned closer closes the file.
func NewLogger(l Log) (*slog.Logger, func(), error) {
	logFile := l.File
	stderr := newHandler(l.JSON, os.Stderr, l.Level, os.Getenv("JOURNAL_STREAM") != "")
	closer := func() {}
	if logFile == "" {
		return slog.New(stderr), closer, nil
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o750); err != nil {
		return nil, nil, fmt.Errorf("cannot create the log file's directory: %w", err)
	}
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot open log file: %w", err)
	}
	closer = func() { f.Close() }
	file := newHandler(l.JSON, f, min(l.Level, slog.LevelInfo), false)
	return slog.New(slog.NewMultiHandler(stderr, file)), closer, nil
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
