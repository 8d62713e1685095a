package sweep

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
		// theirs are sockets of another user (uid 65534), third's of a
		// third (uid 12345); with them the listing shares its 10 among
		// the owners.
		theirs, third []string
		wantMine      int
	}{
		{name: "empty"},
		// More names than one batch reads.
		{name: "a few among many others", files: many("other-", 2000), socks: []string{"kc-1.sock", "kc-2.sock"}, wantSocks: 2},
		{name: "files named like sockets are reported", files: many("kc-f", 3), othersReported: 5, wantFiles: 3},
		{name: "files named like sockets never crowd sockets out", files: many("kc-f", 2000), socks: many("kc-s", 3),
			othersReported: 5, wantSocks: 3, wantFiles: 5, wantLeft: 1995},
		{name: "as many sockets as are kept", socks: many("kc-", 10), wantSocks: 10},
		{name: "one socket more", socks: many("kc-", 11), wantSocks: 10, wantErr: true},
		// A listing that never ends, as a file system could serve one.
		{name: "more entries than are read", files: many("other-", 3001), socks: []string{"kc-1.sock"}, wantSocks: -1, wantErr: true},
		// One user's sockets never crowd another's out, and within the
		// cap one user may have them all.
		{name: "another user's many sockets", theirs: many("kc-n", 12), socks: many("kc-", 2), wantSocks: 10, wantMine: 2, wantErr: true},
		{name: "two others' many sockets", theirs: many("kc-n", 8), third: many("kc-t", 8), socks: many("kc-", 3), wantSocks: 10, wantMine: 3, wantErr: true},
		{name: "more than an even share", theirs: many("kc-n", 12), socks: many("kc-", 7), wantSocks: 10, wantMine: 5, wantErr: true},
		{name: "one owner under the cap", theirs: many("kc-n", 9), socks: many("kc-", 1), wantSocks: 10, wantMine: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortTemp(t) // sockets' paths fit in sun_path
			touch(dir, tc.files...)
			bind(dir, tc.socks...)
			bind(dir, tc.theirs...)
			bind(dir, tc.third...)
			for uid, names := range map[int][]string{nobody: tc.theirs, 12345: tc.third} {
				for _, n := range names {
					if err := os.Lchown(filepath.Join(dir, n), uid, uid); err != nil {
						t.Fatal(err)
					}
				}
			}
			f, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var owner func(string) int
			if tc.theirs != nil {
				owner = func(n string) int {
					var st unix.Stat_t
					if unix.Lstat(filepath.Join(dir, n), &st) != nil {
						return -1
					}
					return int(st.Uid)
				}
			}
			l, err := readNames(int(f.Fd()), isSock, unix.DT_SOCK, limits{10, tc.othersReported, 3000}, owner)
			socks, files, mine := 0, 0, 0
			for _, n := range l.names {
				if !isSock(n) {
					t.Fatalf("kept %q, which was not asked for", n)
				}
				switch {
				case strings.HasPrefix(n, "kc-f"):
					files++
				case strings.HasPrefix(n, "kc-n"), strings.HasPrefix(n, "kc-t"):
					socks++
				default:
					socks++
					mine++
				}
			}
			if mine != tc.wantMine && tc.theirs != nil {
				t.Errorf("kept %d of this user's sockets beside another's %d, want %d", mine, len(tc.theirs), tc.wantMine)
			}
			if tc.wantSocks < 0 { // where the cap falls is the directory's order
				tc.wantSocks = socks
			}
			if socks != tc.wantSocks || files != tc.wantFiles || l.left != tc.wantLeft || (err != nil) != tc.wantErr {
				t.Errorf("readNames kept %d sockets and %d files, left %d, error %v; want %d, %d, %d, error %v",
					socks, files, l.left, err, tc.wantSocks, tc.wantFiles, tc.wantLeft, tc.wantErr)
			}
		})
	}
}

// TestParseDirents: getdents64 records as the kernel lays them out,
// padded to 8 bytes; a name with no type (DT_UNKNOWN) is passed on as
// such, and a record that runs past the buffer is an error, not a read
// beyond it.
func TestParseDirents(t *testing.T) {
	rec := func(name string, typ uint8) []byte {
		n := (19 + len(name) + 1 + 7) &^ 7
		b := make([]byte, n)
		binary.NativeEndian.PutUint64(b, 42)
		binary.NativeEndian.PutUint16(b[16:], uint16(n))
		b[18] = typ
		copy(b[19:], name)
		return b
	}
	type ent struct {
		name string
		typ  uint8
	}
	var good []byte
	for _, r := range [][]byte{rec(".", unix.DT_DIR), rec("..", unix.DT_DIR), rec("kc-1.sock", unix.DT_SOCK), rec("kc-2.sock", unix.DT_UNKNOWN)} {
		good = append(good, r...)
	}
	bad := rec("kc-3.sock", unix.DT_SOCK)
	binary.NativeEndian.PutUint16(bad[16:], uint16(len(bad)+8))
	zero := rec("kc-4.sock", unix.DT_SOCK)
	binary.NativeEndian.PutUint16(zero[16:], 0)
	for _, tc := range []struct {
		name    string
		buf     []byte
		want    []ent
		wantErr bool
	}{
		{"entries", good, []ent{{"kc-1.sock", unix.DT_SOCK}, {"kc-2.sock", unix.DT_UNKNOWN}}, false},
		{"a record past the end", append(rec("kc-1.sock", unix.DT_SOCK), bad...), []ent{{"kc-1.sock", unix.DT_SOCK}}, true},
		{"truncated", good[:10], nil, true},
		{"a record of length 0", zero, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []ent
			err := parseDirents(tc.buf, func(n string, typ uint8) { got = append(got, ent{n, typ}) })
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Errorf("parseDirents = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
