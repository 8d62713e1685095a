package doctor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestReadConfig: what doctor reads of configuration is a regular file
// within its cap; anything else at the name is refused at once.
func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo.conf")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.conf")
	if err := os.Symlink(file("target.conf", "x = 1\n"), link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want, err string
	}{
		{"a file", file("ok.conf", "a = 1\n"), "a = 1\n", ""},
		{"at the cap", file("cap.conf", strings.Repeat("x", 16)), strings.Repeat("x", 16), ""},
		{"a byte over the cap", file("over.conf", strings.Repeat("x", 17)), "", "larger than 16 bytes"},
		{"a symlink to a file (as /etc/alternatives)", link, "x = 1\n", ""},
		{"a FIFO", fifo, "", "not a regular file"},
		{"/dev/null, read as empty (CONTAINERS_CONF_OVERRIDE=/dev/null)", "/dev/null", "", ""},
		{"another device", "/dev/zero", "", "not a regular file"},
		{"a directory", dir, "", "not a regular file"},
		{"missing", filepath.Join(dir, "missing.conf"), "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var data []byte
			var err error
			testutil.NotBlockedBy(t, fifo, func() { data, err = readConfig(tc.path, 16) })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("readConfig = %q, %v; want an error saying %q", data, err, tc.err)
				}
				return
			}
			if err != nil || string(data) != tc.want {
				t.Fatalf("readConfig = %q, %v; want %q", data, err, tc.want)
			}
		})
	}
	if _, err := readConfig(filepath.Join(dir, "missing.conf"), 16); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist (callers take it as not configured)", err)
	}
}

// TestReadHookLogRefusesAFIFO: a FIFO at the hook log's name is an error
// at once, not a wait for a writer.
func TestReadHookLogRefusesAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "kc-hook.log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	testutil.NotBlockedBy(t, fifo, func() { _, _, err = readHookLog(fifo, time.Time{}, 0) })
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("readHookLog = %v, want not a regular file", err)
	}
}
