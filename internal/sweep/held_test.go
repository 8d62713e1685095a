package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// boundSocket binds a socket of type typ to p and leaves it open, neither
// listening nor connected: a server between bind(2) and listen(2), or one
// that never gets to listen. The returned release closes it (once); the
// test's end closes it otherwise.
func boundSocket(t testing.TB, p string, typ int) (fd int, release func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := unix.Close(fd); err != nil {
				t.Errorf("close %s: %v", p, err)
			}
		})
	}
	t.Cleanup(release)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		t.Fatalf("bind %s: %v", p, err)
	}
	return fd, release
}

func TestParseNetUnix(t *testing.T) {
	const header = "Num       RefCount Protocol Flags    Type St Inode Path\n"
	tests := []struct {
		name    string
		in      string
		want    netUnix
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
			want: netUnix{
				"/tmp/kc-1.sock":       {{inode: 1001, state: 1, listening: true}},
				"/tmp/kc-bound.sock":   {{inode: 1002, state: 1}},
				"/tmp/kc-client.sock":  {{inode: 1003, state: 3}},
				"/tmp/kc-dgram.sock":   {{inode: 1004, state: 1}},
				"/tmp/with space.sock": {{inode: 1006, state: 1, listening: true}},
			},
		},
		{
			name: "a path held twice: a listener and a connection it accepted",
			in: header +
				"0000000000000000: 00000002 00000000 00010000 0001 01 2001 /tmp/kc-5.sock\n" +
				"0000000000000000: 00000003 00000000 00000000 0001 03 2002 /tmp/kc-5.sock\n",
			want: netUnix{"/tmp/kc-5.sock": {{inode: 2001, state: 1, listening: true}, {inode: 2002, state: 3}}},
		},
		{
			// The kernel pads the inode to five columns.
			name: "a short inode padded with spaces",
			in: header +
				"0000000000000000: 00000002 00000000 00000000 0001 01    42 /tmp/kc-42.sock\n",
			want: netUnix{"/tmp/kc-42.sock": {{inode: 42, state: 1}}},
		},
		{
			// bind("/tmp/x\nnot a line") prints as two lines; the head
			// is a path (held, the safe side), the tail is skipped.
			name: "the tail of a path with a newline is skipped, not an error",
			in: header +
				"0000000000000000: 00000002 00000000 00000000 0001 01 3001 /tmp/x\n" +
				"not a line at all\n" +
				"0000000000000000: 00000002 00000000 00010000 0001 01 3002 /tmp/kc-3.sock\n",
			want: netUnix{
				"/tmp/x":         {{inode: 3001, state: 1}},
				"/tmp/kc-3.sock": {{inode: 3002, state: 1, listening: true}},
			},
		},
		{name: "empty", in: "", wantErr: true},
		{name: "another layout", in: "Num RefCount Protocol Flags Type St Path Inode\n", wantErr: true},
		{name: "no header", in: "0000000000000000: 00000002 00000000 00010000 0001 01 1001 /tmp/kc-1.sock\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseNetUnix(strings.NewReader(tt.in))
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
		l := listenSocket(t, dir, "kc-7.sock")
		b := filepath.Join(dir, hashedName)
		boundSocket(t, b, unix.SOCK_STREAM)
		nu, err := readNetUnix("/proc", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !nu.listening(l) {
			t.Errorf("own listener %s not listening in /proc/self/net/unix: %+v", l, nu[l])
		}
		if len(nu[b]) != 1 || nu.listening(b) || nu[b][0].state != 1 {
			t.Errorf("own bound socket %s: %+v, want one, unconnected", b, nu[b])
		}
	})
}

func TestListenGate(t *testing.T) {
	tests := []struct {
		name string
		// setup leaves a socket file at p.
		setup   func(t *testing.T, p string)
		unread  bool // net/unix could not be read
		want    say
		wantWhy string
	}{
		{"dead socket", func(t *testing.T, p string) { orphanSocket(t, filepath.Dir(p), filepath.Base(p)) },
			false, sayStale, "connect refused, and not bound in net/unix"},
		{"dead socket, net/unix unread", func(t *testing.T, p string) { orphanSocket(t, filepath.Dir(p), filepath.Base(p)) },
			true, sayUnsure, "net/unix unread"},
		{"bound, not listening", func(t *testing.T, p string) { boundSocket(t, p, unix.SOCK_STREAM) },
			false, sayLive, "a live process holds it"},
		{"listening", func(t *testing.T, p string) { listenSocket(t, filepath.Dir(p), filepath.Base(p)) },
			false, sayLive, "listening"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), hashedName)
			tt.setup(t, p)
			var nu netUnix
			if !tt.unread {
				var err error
				if nu, err = readNetUnix("/proc", 0); err != nil {
					t.Fatal(err)
				}
			}
			got, why := listenGate(p, p, nu, time.Second)
			if got != tt.want || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("%s (%s), want %s with %q", got, why, tt.want, tt.wantWhy)
			}
		})
	}
}

// TestSweepHeldSockets: a socket file whose path a live process holds in
// net/unix — bound and never listening, or a client bound to the name and
// connected elsewhere — refuses connections and never answers /status,
// yet is not stale, however old. Once the holder closes its socket, the
// same file is stale and goes with --apply.
func TestSweepHeldSockets(t *testing.T) {
	type holder struct {
		name string
		// hold makes the socket file at p, held by a socket of this
		// process, and returns how to let go of it.
		hold func(t *testing.T, p string) (release func())
		// wantHeld is in the reason while it is held.
		wantHeld string
	}
	holders := []holder{
		{
			name: "bound, not listening (the reviewer's reproduction)",
			hold: func(t *testing.T, p string) func() {
				_, release := boundSocket(t, p, unix.SOCK_STREAM)
				return release
			},
			wantHeld: "(unconnected)",
		},
		{
			name: "a client bound to the name, connected to a listener elsewhere",
			hold: func(t *testing.T, p string) func() {
				// Never accepted: the connection waits in the backlog,
				// and connect(2) has already succeeded.
				srv := filepath.Join(t.TempDir(), "srv.sock")
				l, err := net.Listen("unix", srv)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				fd, release := boundSocket(t, p, unix.SOCK_STREAM)
				if err := unix.Connect(fd, &unix.SockaddrUnix{Name: srv}); err != nil {
					t.Fatalf("connect %s: %v", srv, err)
				}
				return release
			},
			wantHeld: "(connected)",
		},
		{
			name: "a datagram socket bound to the name",
			hold: func(t *testing.T, p string) func() {
				_, release := boundSocket(t, p, unix.SOCK_DGRAM)
				return release
			},
			wantHeld: "(unconnected)",
		},
		{
			// The holder's own file was unlinked and a dead socket put in
			// its place: the path is still held, and keeping the file
			// is the safe side.
			name: "a bound socket whose file was replaced by a dead one",
			hold: func(t *testing.T, p string) func() {
				_, release := boundSocket(t, p, unix.SOCK_STREAM)
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				orphanSocket(t, filepath.Dir(p), filepath.Base(p))
				return release
			},
			wantHeld: "(unconnected)",
		},
	}
	names := []struct {
		kind string
		name func(t *testing.T) string
		// whileHeld is the verdict while a process holds the path:
		// live for a hashed name (nothing else to go on), unknown for a
		// PID name whose owner is gone (gates 1 and 3 disagree).
		whileHeld Verdict
	}{
		{"hashed", func(*testing.T) string { return hashedName }, VerdictLive},
		{"control of a dead pid", func(t *testing.T) string { return fmt.Sprintf("kc-%d.sock", deadPID(t)) }, VerdictUnknown},
		{"session of a dead pid, no control socket", func(t *testing.T) string { return fmt.Sprintf("kc-%d.abcdefgh.sock", deadPID(t)) }, VerdictUnknown},
	}
	for _, n := range names {
		for _, h := range holders {
			t.Run(n.kind+"/"+h.name, func(t *testing.T) {
				dir := t.TempDir()
				p := filepath.Join(dir, n.name(t))
				release := h.hold(t, p)
				cfg := fastConfig(dir)
				cfg.Now = agedAt(t, p, time.Hour) // far past --hashed-min-age

				for _, apply := range []bool{false, true} {
					cfg.Apply = apply
					s := sweep(t, cfg)[p]
					if s == nil {
						t.Fatalf("apply=%v: %s not reported", apply, p)
					}
					if s.Verdict != n.whileHeld || !strings.Contains(s.Reason, "a live process holds it") || !strings.Contains(s.Reason, h.wantHeld) {
						t.Errorf("apply=%v, held: verdict %s (%s), want %s, held %s", apply, s.Verdict, s.Reason, n.whileHeld, h.wantHeld)
					}
					if s.Action != ActionKept || !exists(p) {
						t.Fatalf("apply=%v, held: action %s (%v), exists %v; want kept", apply, s.Action, s.Err, exists(p))
					}
				}

				release()
				cfg.Apply = true
				s := sweep(t, cfg)[p]
				if s == nil {
					t.Fatalf("%s not reported once released", p)
				}
				if s.Verdict != VerdictStale || !strings.Contains(s.Reason, "not bound in net/unix") {
					t.Errorf("released: verdict %s (%s), want stale", s.Verdict, s.Reason)
				}
				if s.Action != ActionUnlinked || exists(p) {
					t.Errorf("released, --apply: action %s (%v), exists %v; want unlinked", s.Action, s.Err, exists(p))
				}
			})
		}
	}
}
