package sweep

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadNames: a listing keeps only the names asked for, however many
// others the directory holds; of those of the wanted file type at most
// its cap (10 here), of the others (files named like sockets) a few, counting the
// rest, so that they never crowd a socket out.
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
	bind := func(dir string, names ...string) {
		for _, n := range names {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(dir, n)})
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
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
		name           string
		files, socks   []string
		wantSocks      int
		wantFiles      int
		wantLeft       int
		wantErr        bool
		othersReported int
	}{
		{name: "empty"},
		// More names than one batch reads.
		{name: "a few among many others", files: many("other-", 1100), socks: []string{"kc-1.sock", "kc-2.sock"}, wantSocks: 2},
		{name: "files named like sockets are reported", files: many("kc-f", 3), othersReported: 5, wantFiles: 3},
		{name: "files named like sockets never crowd sockets out", files: many("kc-f", 2000), socks: many("kc-s", 3),
			othersReported: 5, wantSocks: 3, wantFiles: 5, wantLeft: 1995},
		{name: "as many sockets as are kept", socks: many("kc-", 10), wantSocks: 10},
		{name: "one socket more", socks: many("kc-", 11), wantSocks: 10, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			touch(dir, tc.files...)
			bind(dir, tc.socks...)
			f, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			l, err := readNames(f, isSock, fs.ModeSocket, 10, tc.othersReported)
			socks, files := 0, 0
			for _, n := range l.names {
				if !isSock(n) {
					t.Fatalf("kept %q, which was not asked for", n)
				}
				if strings.HasPrefix(n, "kc-f") {
					files++
				} else {
					socks++
				}
			}
			if socks != tc.wantSocks || files != tc.wantFiles || l.left != tc.wantLeft || (err != nil) != tc.wantErr {
				t.Errorf("readNames kept %d sockets and %d files, left %d, error %v; want %d, %d, %d, error %v",
					socks, files, l.left, err, tc.wantSocks, tc.wantFiles, tc.wantLeft, tc.wantErr)
			}
		})
	}
}
