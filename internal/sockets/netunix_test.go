package sockets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestParseNetUnix(t *testing.T) {
	const header = "Num       RefCount Protocol Flags    Type St Inode Path\n"
	tests := []struct {
		name    string
		in      string
		want    NetUnix
		wantErr bool
	}{
		{
			name: "every state of a bound path is kept; abstract and unnamed are not",
			in: header +
				"0000000000000000: 00000002 00000000 00010000 0001 01 1001 /tmp/kc-1.sock\n" +
				"0000000000000000: 00000002 00000000 00000000 0001 01 1002 /tmp/kc-bound.sock\n" +
				"0000000000000000: 00000003 00000000 00000000 0001 03 1003 /tmp/kc-client.sock\n" +
				"0000000000000000: 00000002 00000000 00000000 0002 01 1004 /tmp/kc-dgram.sock\n" +
				"0000000000000000: 00000002 00000000 00010000 0001 01 1005 @abstract\n" +
				"0000000000000000: 00000002 00000000 00010000 0001 01 1006 /tmp/with space.sock\n" +
				"0000000000000000: 00000003 00000000 00000000 0001 03 1007\n",
			want: NetUnix{
				"/tmp/kc-1.sock":       {{Inode: 1001, State: 1, Listening: true}},
				"/tmp/kc-bound.sock":   {{Inode: 1002, State: 1}},
				"/tmp/kc-client.sock":  {{Inode: 1003, State: 3}},
				"/tmp/kc-dgram.sock":   {{Inode: 1004, State: 1}},
				"/tmp/with space.sock": {{Inode: 1006, State: 1, Listening: true}},
			},
		},
		{
			name: "a path held twice: a listener and a connection it accepted",
			in: header +
				"0000000000000000: 00000002 00000000 00010000 0001 01 2001 /tmp/kc-5.sock\n" +
				"0000000000000000: 00000003 00000000 00000000 0001 03 2002 /tmp/kc-5.sock\n",
			want: NetUnix{"/tmp/kc-5.sock": {{Inode: 2001, State: 1, Listening: true}, {Inode: 2002, State: 3}}},
		},
		{
			// The kernel pads the inode to five columns.
			name: "a short inode padded with spaces",
			in: header +
				"0000000000000000: 00000002 00000000 00000000 0001 01    42 /tmp/kc-42.sock\n",
			want: NetUnix{"/tmp/kc-42.sock": {{Inode: 42, State: 1}}},
		},
		{
			// bind("/tmp/x\nnot a line") prints as two lines; the head
			// is a path (held, the safe side), the tail is skipped.
			name: "the tail of a path with a newline is skipped, not an error",
			in: header +
				"0000000000000000: 00000002 00000000 00000000 0001 01 3001 /tmp/x\n" +
				"not a line at all\n" +
				"0000000000000000: 00000002 00000000 00010000 0001 01 3002 /tmp/kc-3.sock\n",
			want: NetUnix{
				"/tmp/x":         {{Inode: 3001, State: 1}},
				"/tmp/kc-3.sock": {{Inode: 3002, State: 1, Listening: true}},
			},
		},
		{name: "empty", in: "", wantErr: true},
		{name: "another layout", in: "Num RefCount Protocol Flags Type St Path Inode\n", wantErr: true},
		{name: "no header", in: "0000000000000000: 00000002 00000000 00010000 0001 01 1001 /tmp/kc-1.sock\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseNetUnix(strings.NewReader(tt.in), maxNetUnix)
			if tt.wantErr {
				if !errors.Is(err, errNetUnixFormat) || got != nil {
					t.Fatalf("got %v, %v; want a format error and no table", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}

	t.Run("the real file lists our listener and our bound socket", func(t *testing.T) {
		dir := t.TempDir()
		l := filepath.Join(dir, "kc-7.sock")
		listen(t, l)
		b := filepath.Join(dir, "kc-3fa9c2d17b604e81.sock")
		testutil.BoundSocket(t, b, unix.SOCK_STREAM)
		nu, err := ReadNetUnix("/proc", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !Listening(nu[l]) {
			t.Errorf("own listener %s not listening in /proc/self/net/unix: %+v", l, nu[l])
		}
		if len(nu[b]) != 1 || Listening(nu[b]) || nu[b][0].State != 1 {
			t.Errorf("own bound socket %s: %+v, want one, unconnected", b, nu[b])
		}
	})
}

// TestParseNetUnixBound: a table listing more sockets than the bound is
// no evidence (an error, read as "cannot tell"), not a cost.
func TestParseNetUnixBound(t *testing.T) {
	var b strings.Builder
	b.WriteString("Num       RefCount Protocol Flags    Type St Inode Path\n")
	for i := range 11 {
		fmt.Fprintf(&b, "0000000000000000: 00000002 00000000 00000000 0001 03 %d /tmp/kc-1.sock\n", 1000+i)
	}
	if _, err := parseNetUnix(strings.NewReader(b.String()), 10); !errors.Is(err, errNetUnixTooLarge) {
		t.Errorf("11 sockets, bound 10: %v, want %v", err, errNetUnixTooLarge)
	}
	n, err := parseNetUnix(strings.NewReader(b.String()), 11)
	if err != nil || len(n["/tmp/kc-1.sock"]) != 11 {
		t.Errorf("11 sockets, bound 11: %d, %v", len(n["/tmp/kc-1.sock"]), err)
	}
}

// TestReadNetUnixMergesByInode: the two reads are merged by inode, one
// entry each, however many sockets share a path (a listener's accepted
// connections).
func TestReadNetUnixMergesByInode(t *testing.T) {
	root := t.TempDir()
	writeNetUnix(t, root, 5000)
	n, err := ReadNetUnix(root, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(n["/tmp/kc-1.sock"]); got != 5000 {
		t.Errorf("%d sockets under the path, want 5000", got)
	}
}

// BenchmarkReadNetUnixOnePath: a user's 100,000 accepted connections
// under one path (pairwise merging took seconds).
func BenchmarkReadNetUnixOnePath(b *testing.B) {
	root := b.TempDir()
	writeNetUnix(b, root, 100000)
	for b.Loop() {
		if _, err := ReadNetUnix(root, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// writeNetUnix writes root/1/net/unix listing n connected sockets under
// one path.
func writeNetUnix(t testing.TB, root string, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("Num       RefCount Protocol Flags    Type St Inode Path\n")
	for i := range n {
		fmt.Fprintf(&b, "0000000000000000: 00000002 00000000 00000000 0001 03 %d /tmp/kc-1.sock\n", 100000+i)
	}
	if err := os.MkdirAll(filepath.Join(root, "1", "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "1", "net", "unix"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
