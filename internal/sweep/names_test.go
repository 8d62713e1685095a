package sweep

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadNames: a listing keeps only the names asked for, however many
// others the directory holds, and at most its cap of them.
func TestReadNames(t *testing.T) {
	touch := func(dir string, names ...string) {
		for _, n := range names {
			fd, err := unix.Open(filepath.Join(dir, n), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
		}
	}
	many := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}
	isSock := func(n string) bool { return strings.HasPrefix(n, "kc-") }
	for _, tc := range []struct {
		name    string
		names   []string
		want    int
		wantErr bool
	}{
		{"empty", nil, 0, false},
		// More names than one batch reads.
		{"a few among many others", append(many("other-", 1100), "kc-1.sock", "kc-2.sock"), 2, false},
		{"as many as are kept", many("kc-", 10), 10, false},
		{"one more", many("kc-", 11), 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			touch(dir, tc.names...)
			f, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := readNames(f, isSock, 10)
			if len(got) != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("readNames = %d names, %v; want %d, error %v", len(got), err, tc.want, tc.wantErr)
			}
			for _, n := range got {
				if !isSock(n) {
					t.Fatalf("kept %q, which was not asked for", n)
				}
			}
		})
	}
}
