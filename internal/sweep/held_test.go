package sweep

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// boundSocket binds a socket of type typ to p and leaves it open, neither
// listening nor connected (testutil.BoundSocket).
func boundSocket(t testing.TB, p string, typ int) (fd int, release func()) {
	return testutil.BoundSocket(t, p, typ)
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
			var nu sockets.NetUnix
			if !tt.unread {
				var err error
				if nu, err = sockets.ReadNetUnix("/proc", 0); err != nil {
					t.Fatal(err)
				}
			}
			got, why := judgeListen(dialSocket(context.Background(), p, time.Second), p, sockets.File{}, nu)
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
					if s.Action != ActionKept || !testutil.PathExists(p) {
						t.Fatalf("apply=%v, held: action %s (%v), exists %v; want kept", apply, s.Action, s.Err, testutil.PathExists(p))
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
				if s.Action != ActionUnlinked || testutil.PathExists(p) {
					t.Errorf("released, --apply: action %s (%v), exists %v; want unlinked", s.Action, s.Err, testutil.PathExists(p))
				}
			})
		}
	}
}

// TestSweepHeldThroughAnotherName: the holder bound the socket file by
// one name and the sweep reaches it by another (a --socket-dir through a
// symlink, as /var/run is to /run; or a holder that bound through one).
// net/unix lists only the binder's path; the file is known held all the
// same, and kept however old.
func TestSweepHeldThroughAnotherName(t *testing.T) {
	tests := []struct {
		name string
		// bindDir and sweepDir are the names of one directory.
		bindDir, sweepDir func(real, link string) string
	}{
		{"swept through a symlink", func(real, _ string) string { return real }, func(_, link string) string { return link }},
		{"bound through a symlink", func(_, link string) string { return link }, func(real, _ string) string { return real }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			real := t.TempDir()
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			_, release := boundSocket(t, filepath.Join(tt.bindDir(real, link), hashedName), unix.SOCK_STREAM)
			defer release()
			p := filepath.Join(tt.sweepDir(real, link), hashedName)
			cfg := fastConfig(tt.sweepDir(real, link))
			cfg.Now = agedAt(t, p, time.Hour)
			cfg.Apply = true
			s := sweep(t, cfg)[p]
			if s == nil {
				t.Fatalf("%s not reported", p)
			}
			if s.Verdict != VerdictLive || s.Action != ActionKept || !testutil.PathExists(p) {
				t.Errorf("verdict %s, action %s (%s); want live and kept", s.Verdict, s.Action, s.Reason)
			}
		})
	}
}
