package supervise

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestCappedFile: a file written past its cap is emptied, says so, and
// keeps the most recent output; it never holds much more than the cap.
func TestCappedFile(t *testing.T) {
	for _, flags := range []struct {
		name string
		flag int
	}{{"appending", os.O_APPEND}, {"overwriting (a shell's >)", os.O_TRUNC}} {
		t.Run(flags.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "supervisor.log")
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flags.flag, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const limit = 64 << 10
			c := &cappedFile{f: f, max: limit}
			chunk := bytes.Repeat([]byte("k"), 10<<10)
			for i := range 40 {
				chunk[0] = byte('a' + i%26)
				if n, err := c.Write(chunk); err != nil || n != len(chunk) {
					t.Fatalf("write %d: %d, %v", i, n, err)
				}
				if st, _ := f.Stat(); st.Size() > limit+200 {
					t.Fatalf("after write %d the file holds %d bytes, cap %d", i, st.Size(), limit)
				}
			}
			if _, err := c.Write(bytes.Repeat([]byte("z"), 3*limit)); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(data) > limit+200 || !strings.HasPrefix(string(data), "kc-hook supervise: output over 65536 bytes") || !bytes.HasSuffix(data, []byte("zzzz")) {
				t.Errorf("log of %d bytes starting %q, ending %q", len(data), data[:min(len(data), 60)], data[max(0, len(data)-8):])
			}
		})
	}
}

// TestCappedOutputOnAFullDisk: when the log's file system is full, the
// supervisor's writes still succeed (its output is dropped, not its
// pipe closed: a kernel would die of EPIPE at its next print), and once
// there is room again the log says how much was lost.
func TestCappedOutputOnAFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := testutil.MountTmpfs(t, t.TempDir(), "run")
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte("f"), 48<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "supervisor.log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, stop, err := capOutput(f, DefaultOutputCap)
	if err != nil {
		t.Fatal(err)
	}
	// Four times a pipe's buffer: the copy must go on reading for these
	// writes to return.
	chunk := bytes.Repeat([]byte("k"), 4<<10)
	for i := range 64 {
		if _, err := w.Write(chunk); err != nil {
			stop()
			t.Fatalf("write %d of the supervisor's output: %v", i, err)
		}
	}
	// Room comes back once the copy has read all of it: what it reads
	// later would otherwise fill the room again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := unix.IoctlGetInt(int(w.Fd()), unix.TIOCINQ) // FIONREAD
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the copy left %d bytes unread", n)
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("room again\n")); err != nil {
		t.Fatal(err)
	}
	stop()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "bytes of output were lost: write "+path+": no space left on device\n") || !strings.HasSuffix(string(data), "room again\n") {
		t.Errorf("log of %d bytes ends %q; want the loss noted, then the output that fit", len(data), data[max(0, len(data)-120):])
	}
}
