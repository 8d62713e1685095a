package janitor

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestJSONDurations: a duration is logged in seconds in JSON, never in
// nanoseconds.
func TestJSONDurations(t *testing.T) {
	var buf strings.Builder
	h := newHandler(true, &buf, 0, false)
	slog.New(h).Info("watching", "interval", 90*time.Second)
	if !strings.Contains(buf.String(), `"interval_seconds":90`) {
		t.Errorf("JSON duration: %s", buf.String())
	}
}

// TestLogFileKeysOnce: a key given by a step's logger and again below it
// (watch's "step" event, then pidfd) is written once, the nearer value.
func TestLogFileKeysOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "janitor.log")
	log, closeLog, err := NewLogger(Log{JSON: true, Level: slog.LevelError, File: file})
	if err != nil {
		t.Fatal(err)
	}
	log.With("step", "event", "container", "c").With("step", "pidfd").Info("m", "container", "c")
	closeLog()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	line := string(data)
	if strings.Count(line, `"step":`) != 1 || !strings.Contains(line, `"step":"pidfd"`) || strings.Count(line, `"container":`) != 1 {
		t.Errorf("log line %s: want step pidfd and container, once each", line)
	}
}

// TestLogFileRefusesWhatOthersPlant: the log file may sit where others
// can write (a seed's ./kc-sweeper.log): a symlink is not followed (its
// target is left as it was), a FIFO is not waited on, a file of another
// user's or with another link is not written; a file of ours and
// /dev/null are.
func TestLogFileRefusesWhatOthersPlant(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("untouched\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// plant lays out the log's path; "" for none.
		plant func(t *testing.T, p string)
		ok    bool
	}{
		{"none yet", nil, true},
		{"a file of ours", func(t *testing.T, p string) { os.WriteFile(p, nil, 0o640) }, true},
		{"a symlink", func(t *testing.T, p string) { os.Symlink(victim, p) }, false},
		{"a FIFO", func(t *testing.T, p string) { unix.Mkfifo(p, 0o666) }, false},
		{"a hard link", func(t *testing.T, p string) { os.Link(victim, p) }, false},
		{"another user's", func(t *testing.T, p string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root: the file is given away")
			}
			os.WriteFile(p, nil, 0o666)
			os.Chown(p, 65534, 65534)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "kc.log")
			if tc.plant != nil {
				tc.plant(t, p)
			}
			done := make(chan error, 1)
			go func() { done <- AppendFailure(Log{File: p}, "sweep", "exit", 1) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("opening the log waits")
			}
			if (err == nil) != tc.ok {
				t.Errorf("AppendFailure = %v; want ok %v", err, tc.ok)
			}
			if data, _ := os.ReadFile(victim); string(data) != "untouched\n" {
				t.Errorf("the victim holds %q", data)
			}
		})
	}
	if err := AppendFailure(Log{File: "/dev/null"}, "sweep"); err != nil {
		t.Errorf("/dev/null: %v", err)
	}
}
