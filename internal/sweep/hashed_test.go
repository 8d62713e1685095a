package sweep

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// hashedName is a name in Kallichore's hashed form, kc-<hex>.sock.
const hashedName = "kc-3fa9c2d17b604e81.sock"

// ctimeOf is the inode change time of p (not following symlinks): the
// clock a hashed socket's age is measured on.
func ctimeOf(t testing.TB, p string) time.Time {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return time.Unix(st.Ctim.Unix())
}

func inodeOf(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// agedAt returns a clock that reads age past p's ctime, so a sweep sees p
// exactly that old without the test waiting for it.
func agedAt(t testing.TB, p string, age time.Duration) func() time.Time {
	at := ctimeOf(t, p).Add(age)
	return func() time.Time { return at }
}

// linkFakeSession hard-links the session socket of a fake kcserver
// running in its own directory to dir/name: the same socket inode, so a
// connect through the link reaches the fake.
func linkFakeSession(t *testing.T, k *testutil.KCServer, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Link(filepath.Join(k.Dir, fmt.Sprintf("kc-%d.%s.sock", k.PID, sessionTag)), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSweepHashed(t *testing.T) {
	const old = 10 * time.Minute
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the hashed socket
		// age is how old the sweep's clock makes the socket; nil clock
		// (realClock) leaves time.Now.
		age          time.Duration
		realClock    bool
		want         Verdict
		wantInReason []string
	}{
		{
			name: "live fake kcserver's session socket under a hashed name (a channel: no HTTP)",
			setup: func(t *testing.T, dir string) string {
				k := testutil.StartKCServer(t, shortTemp(t), testutil.Fake{OpenChannels: true})
				return linkFakeSession(t, k, dir, hashedName)
			},
			age: old, want: VerdictLive,
			wantInReason: []string{"listening"},
		},
		{
			name: "a listener that does not speak HTTP",
			setup: func(t *testing.T, dir string) string {
				return listenSocket(t, dir, hashedName)
			},
			age: old, want: VerdictLive,
			wantInReason: []string{"listening"},
		},
		{
			name: "SIGKILLed kcserver, older than the minimum age",
			setup: func(t *testing.T, dir string) string {
				k := testutil.StartKCServer(t, shortTemp(t), testutil.Fake{OpenChannels: true})
				p := linkFakeSession(t, k, dir, hashedName)
				k.Kill(t)
				waitDead(t, k.PID)
				return p
			},
			age: old, want: VerdictStale,
			wantInReason: []string{"connect refused", "/status silent twice", "not listening"},
		},
		{
			name: "nobody listening, exactly the minimum age",
			setup: func(t *testing.T, dir string) string {
				return orphanSocket(t, dir, hashedName)
			},
			age: DefaultHashedMinAge, want: VerdictStale,
			wantInReason: []string{"connect refused", "/status silent twice", "minimum age 2m0s"},
		},
		{
			name: "nobody listening, just under the minimum age: may be between bind and listen",
			setup: func(t *testing.T, dir string) string {
				return orphanSocket(t, dir, hashedName)
			},
			age: DefaultHashedMinAge - time.Millisecond, want: VerdictUnknown,
			wantInReason: []string{"connect refused", "/status silent twice", "under the 2m0s minimum age"},
		},
		{
			name: "nobody listening, created just now (the real clock)",
			setup: func(t *testing.T, dir string) string {
				return orphanSocket(t, dir, hashedName)
			},
			realClock: true, want: VerdictUnknown,
			wantInReason: []string{"under the 2m0s minimum age"},
		},
		{
			name: "nobody listening, ctime in the future (a clock stepped back)",
			setup: func(t *testing.T, dir string) string {
				return orphanSocket(t, dir, hashedName)
			},
			age: -time.Hour, want: VerdictUnknown,
			wantInReason: []string{"minimum age"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := tt.setup(t, dir)
			cfg := fastConfig(dir)
			if !tt.realClock {
				cfg.Now = agedAt(t, p, tt.age)
			}

			got := sweep(t, cfg)
			s := got[p]
			if len(got) != 1 || s == nil {
				t.Fatalf("swept %v, want only %s", keys(got), p)
			}
			if !s.Hashed || s.PID != 0 || s.Kind != sockets.KindSession {
				t.Errorf("hashed %v pid %d kind %s, want a pid-less session socket", s.Hashed, s.PID, s.Kind)
			}
			if s.Verdict != tt.want {
				t.Errorf("verdict %s (%s), want %s", s.Verdict, s.Reason, tt.want)
			}
			if !strings.HasPrefix(s.Reason, hashedHead) {
				t.Errorf("reason %q does not say the name is hashed", s.Reason)
			}
			for _, w := range tt.wantInReason {
				if !strings.Contains(s.Reason, w) {
					t.Errorf("reason %q lacks %q", s.Reason, w)
				}
			}
			wantAction := ActionKept
			if tt.want == VerdictStale {
				wantAction = ActionWouldUnlink
			}
			if s.Action != wantAction || !testutil.PathExists(p) {
				t.Errorf("dry run: action %s, exists %v; want %s and kept", s.Action, testutil.PathExists(p), wantAction)
			}

			cfg.Apply = true
			s = sweep(t, cfg)[p]
			if s == nil {
				t.Fatal("not found on the second sweep")
			}
			if tt.want == VerdictStale {
				if s.Action != ActionUnlinked || testutil.PathExists(p) {
					t.Errorf("--apply: action %s (%v), exists %v; want unlinked", s.Action, s.Err, testutil.PathExists(p))
				}
			} else if s.Action != ActionKept || !testutil.PathExists(p) {
				t.Errorf("--apply: action %s, exists %v; want kept (%s)", s.Action, testutil.PathExists(p), s.Reason)
			}
		})
	}
}

// TestSweepHashedNeverUnlinks: entries with a hashed name that are not
// the directory owner's sockets stay, however old and dead they look.
func TestSweepHashedNeverUnlinks(t *testing.T) {
	tests := []struct {
		name         string
		setup        func(t *testing.T, dir string) string
		want         Verdict
		wantInReason string
	}{
		{
			name: "symlink to a dead socket elsewhere",
			setup: func(t *testing.T, dir string) string {
				target := orphanSocket(t, t.TempDir(), hashedName)
				p := filepath.Join(dir, hashedName)
				if err := os.Symlink(target, p); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if !testutil.PathExists(target) {
						t.Error("symlink target removed")
					}
				})
				return p
			},
			want: VerdictUnknown, wantInReason: "not a socket (symlink)",
		},
		{
			name: "FIFO",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, hashedName)
				if err := unix.Mkfifo(p, 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: VerdictUnknown, wantInReason: "not a socket (FIFO)",
		},
		{
			name: "regular file",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, hashedName)
				if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: VerdictUnknown, wantInReason: "not a socket (regular file)",
		},
		{
			name: "directory",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, hashedName)
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: VerdictUnknown, wantInReason: "not a socket (directory)",
		},
		{
			name: "another uid's dead socket in a directory it does not own",
			setup: func(t *testing.T, dir string) string {
				p := orphanSocket(t, dir, hashedName)
				if err := os.Lchown(p, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: VerdictStale, wantInReason: "not unlinked: owned by uid 65534",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir() // 0700, owned by the test's uid
			p := tt.setup(t, dir)
			cfg := fastConfig(dir)
			cfg.Apply = true
			cfg.Now = agedAt(t, p, time.Hour)
			got := sweep(t, cfg)
			s := got[p]
			if s == nil {
				t.Fatalf("not reported: %v", keys(got))
			}
			if s.Verdict != tt.want || !strings.Contains(s.Reason, tt.wantInReason) {
				t.Errorf("verdict %s (%s), want %s with %q", s.Verdict, s.Reason, tt.want, tt.wantInReason)
			}
			if s.Action != ActionKept || !testutil.PathExists(p) {
				t.Errorf("action %s (%v), exists %v; want kept", s.Action, s.Err, testutil.PathExists(p))
			}
		})
	}
}

// TestSweepHashedLookAlikes: names that resemble the hashed form but are
// not it are not even reported, let alone unlinked.
func TestSweepHashedLookAlikes(t *testing.T) {
	// A short directory: the longest name must still fit in sun_path.
	dir, err := os.MkdirTemp("", "kch")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var paths []string
	for _, n := range []string{
		"kc-3FA9C2D17B604E81.sock",                // uppercase
		"kc-3Fa9c2d17b604e81.sock",                // one uppercase digit
		"kc-xyz.sock",                             // not hex
		"kc-3fa9c2d17b604e8g.sock",                // one non-hex letter
		"kc-03fa9c2d17b604e8.sock",                // padded: {:x} never is
		"kc-" + strings.Repeat("ab", 9) + ".sock", // 18 digits: more than a u64
		"kc-3fa9c2d17b604e81.x.sock",              // a hash with a tag
		"kc-3fa9c2d17b604e81.sock.bak",            // a suffix
		"kc-0x3fa9c2d17b604e81.sock",              // a 0x prefix
		"kc--3fa9c2d17b604e81.sock",               // a sign
		"kc-3fa9c2d17b604e81 .sock",               // a space
		"kc-\uff13fa9c2d17b604e81.sock",           // a fullwidth digit
		"KC-3fa9c2d17b604e81.sock",                // uppercase prefix
		"kc-3fa9c2d17b604e81.SOCK",                // uppercase suffix
		"xkc-3fa9c2d17b604e81.sock",               // a leading character
		"kc-3fa9c2d17b604e81.sock\n",              // a trailing newline
		"kc-3fa9c2d1.7b604e81.sock",               // a dot inside
	} {
		paths = append(paths, orphanSocket(t, dir, n))
	}
	cfg := fastConfig(dir)
	cfg.Apply = true
	cfg.Now = agedAt(t, paths[0], time.Hour)
	if got := sweep(t, cfg); len(got) != 0 {
		t.Errorf("reported %v, want nothing", keys(got))
	}
	for _, p := range paths {
		if !testutil.PathExists(p) {
			t.Errorf("%q removed", filepath.Base(p))
		}
	}
}

// TestSweepHashedSwapped swaps a stale hashed socket for another file
// between its two /status tries: a tripwire socket does the swap when
// the sweep first asks it for /status, then stays silent, and the
// victim's second try comes a pause later. That try must not dial
// whatever now has the name (a silence there would count as the
// victim's): it is pinned to the inode listed, sees the swap, and the
// victim is kept as unknown. (sockets.UnlinkAt's own check, for a swap
// after the last probe, is tested there.)
func TestSweepHashedSwapped(t *testing.T) {
	tests := []struct {
		name string
		// swapIn creates the replacement at tmp.
		swapIn func(t *testing.T, tmp string) error
	}{
		{"a new socket", func(t *testing.T, tmp string) error {
			orphanSocket(t, filepath.Dir(tmp), filepath.Base(tmp))
			return nil
		}},
		{"another uid's socket", func(t *testing.T, tmp string) error {
			orphanSocket(t, filepath.Dir(tmp), filepath.Base(tmp))
			return os.Lchown(tmp, 65534, 65534)
		}},
		{"a FIFO", func(t *testing.T, tmp string) error {
			return unix.Mkfifo(tmp, 0o600)
		}},
		{"a regular file", func(t *testing.T, tmp string) error {
			return os.WriteFile(tmp, []byte("x"), 0o600)
		}},
		{"a symlink to a dead socket elsewhere", func(t *testing.T, tmp string) error {
			return os.Symlink(orphanSocket(t, t.TempDir(), hashedName), tmp)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := orphanSocket(t, dir, hashedName)
			now := agedAt(t, victim, time.Hour)
			// The replacement is made beforehand, next to nothing the
			// sweep looks at; the tripwire only renames it into place
			// (rename(2): the name never goes missing in between).
			replacement := filepath.Join(t.TempDir(), "swap")
			if err := tt.swapIn(t, replacement); err != nil {
				t.Fatal(err)
			}
			swapped := inodeOf(t, replacement)

			var (
				once    sync.Once
				swapErr error
				done    = make(chan struct{})
			)
			l, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf("kc-%d.sock", deadPID(t))))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				once.Do(func() {
					swapErr = os.Rename(replacement, victim)
					close(done)
				})
				if hj, ok := w.(http.Hijacker); ok {
					if c, _, err := hj.Hijack(); err == nil {
						c.Close()
					}
				}
			}))

			cfg := fastConfig(dir)
			cfg.Apply = true
			cfg.Now = now
			s := sweep(t, cfg)[victim]
			select {
			case <-done:
			default:
				t.Fatal("the tripwire was never asked for /status")
			}
			if swapErr != nil {
				t.Fatalf("swap: %v", swapErr)
			}
			if s == nil {
				t.Fatal("victim not reported")
			}
			if s.Verdict != VerdictUnknown || s.Action != ActionKept || !strings.Contains(s.Reason, errReplaced.Error()) {
				t.Errorf("%s, %s (%v): %s; want unknown and kept, as replaced", s.Verdict, s.Action, s.Err, s.Reason)
			}
			if !testutil.PathExists(victim) || inodeOf(t, victim) != swapped {
				t.Errorf("the swapped-in file was removed or replaced")
			}
		})
	}
}

func TestJudgeHashed(t *testing.T) {
	const minAge = time.Minute
	refused := statusTry{err: errors.New("connect: connection refused")}
	kallichore := statusTry{answered: true, pid: 42}
	other := statusTry{answered: true, other: "HTTP 404"}
	tests := []struct {
		name       string
		listen     say
		tries      []statusTry
		age        time.Duration
		want       Verdict
		wantReason string
	}{
		{"stale: refused, silent twice, old", sayStale, []statusTry{refused, refused}, 2 * minAge, VerdictStale, "not listening"},
		{"stale at exactly the minimum age", sayStale, []statusTry{refused, refused}, minAge, VerdictStale, "minimum age 1m0s"},
		{"young", sayStale, []statusTry{refused, refused}, minAge - time.Nanosecond, VerdictUnknown, "under the 1m0s minimum age"},
		{"negative age", sayStale, []statusTry{refused, refused}, -minAge, VerdictUnknown, "minimum age"},
		{"silent once only", sayStale, []statusTry{refused}, 2 * minAge, VerdictUnknown, "silent once"},
		{"listening, silent twice", sayLive, []statusTry{refused, refused}, 2 * minAge, VerdictLive, "listening"},
		{"refused, then Kallichore answers", sayStale, []statusTry{refused, kallichore}, 2 * minAge, VerdictLive, "process_id 42"},
		{"something else answers", sayStale, []statusTry{other}, 2 * minAge, VerdictLive, "something answers /status: HTTP 404"},
		{"gate 2 unsure", sayUnsure, []statusTry{refused, refused}, 2 * minAge, VerdictUnknown, "unsure-why"},
		{"not probed", sayUnsure, nil, 2 * minAge, VerdictUnknown, "not probed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Socket{Hashed: true, tries: tt.tries}
			s.gates[1] = tt.listen
			s.why[1] = map[say]string{sayStale: "connect refused", sayLive: "listening", sayUnsure: "unsure-why"}[tt.listen]
			if tt.tries == nil {
				s.why = [3]string{"not probed: context canceled"}
			}
			v, why := judgeHashed(s, tt.age, minAge)
			if v != tt.want || !strings.Contains(why, tt.wantReason) || !strings.HasPrefix(why, hashedHead) {
				t.Errorf("%s (%s), want %s with %q", v, why, tt.want, tt.wantReason)
			}
		})
	}
}
