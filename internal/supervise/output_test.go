package supervise

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
