package sweep

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// sessionTag is the <x> of the fake's default session socket.
const sessionTag = "python-0"

func TestSweepVerdicts(t *testing.T) {
	tests := []struct {
		name string
		// setup creates sockets in dir and returns the paths expected
		// with their verdicts.
		setup       func(t *testing.T, dir string) map[string]Verdict
		wantInCause string
	}{
		{
			name: "live fake kcserver: control and session kept",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				k := testutil.StartKCServer(t, dir, testutil.Fake{OpenChannels: true, Children: 1})
				return map[string]Verdict{
					k.Socket: VerdictLive,
					filepath.Join(dir, fmt.Sprintf("kc-%d.%s.sock", k.PID, sessionTag)): VerdictLive,
				}
			},
		},
		{
			name: "SIGKILLed kcserver: control and session stale",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				k := testutil.StartKCServer(t, dir, testutil.Fake{OpenChannels: true})
				k.Kill(t)
				waitDead(t, k.PID)
				return map[string]Verdict{
					k.Socket: VerdictStale,
					filepath.Join(dir, fmt.Sprintf("kc-%d.%s.sock", k.PID, sessionTag)): VerdictStale,
				}
			},
			wantInCause: "connect refused",
		},
		{
			name: "pid recycled by a non-kcserver process",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				pid := startSleep(t)
				return map[string]Verdict{orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", pid)): VerdictStale}
			},
			wantInCause: `"sleep", not a supervisor`,
		},
		{
			name: "pid is a thread ID of another process",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				tid := threadID(t)
				return map[string]Verdict{orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", tid)): VerdictStale}
			},
			wantInCause: "is a thread of process",
		},
		{
			name: "pid gone",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				pid := deadPID(t)
				return map[string]Verdict{orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", pid)): VerdictStale}
			},
			wantInCause: "no process",
		},
		{
			name: "orphan session socket without control socket",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				pid := deadPID(t)
				return map[string]Verdict{orphanSocket(t, dir, fmt.Sprintf("kc-%d.abcdefgh.sock", pid)): VerdictStale}
			},
			wantInCause: "no control socket",
		},
		{
			name: "listening, but the named owner is not a supervisor: gates disagree",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				pid := startSleep(t)
				return map[string]Verdict{listenSocket(t, dir, fmt.Sprintf("kc-%d.sock", pid)): VerdictUnknown}
			},
			wantInCause: "gates disagree",
		},
		{
			name: "session socket of a live server that nobody listens on follows the server",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				k := testutil.StartKCServer(t, dir, testutil.Fake{})
				return map[string]Verdict{
					k.Socket: VerdictLive,
					orphanSocket(t, dir, fmt.Sprintf("kc-%d.deadbeef.sock", k.PID)): VerdictLive,
				}
			},
		},
		{
			name: "another live kcserver answers on the socket: process_id differs",
			setup: func(t *testing.T, dir string) map[string]Verdict {
				a := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
				b := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
				p := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", a.PID))
				if err := os.Link(b.Socket, p); err != nil {
					t.Fatal(err)
				}
				return map[string]Verdict{p: VerdictUnknown}
			},
			wantInCause: "process_id",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			want := tt.setup(t, dir)
			got := sweep(t, fastConfig(dir))
			if len(got) != len(want) {
				t.Errorf("swept %d sockets, want %d: %v", len(got), len(want), keys(got))
			}
			for p, v := range want {
				s := got[p]
				if s == nil {
					t.Errorf("%s not found", p)
					continue
				}
				if s.Verdict != v {
					t.Errorf("%s: verdict %s (%s), want %s", p, s.Verdict, s.Reason, v)
				}
				if tt.wantInCause != "" && s.Kind == sockets.KindControl && !strings.Contains(s.Reason, tt.wantInCause) {
					t.Errorf("%s: reason %q lacks %q", p, s.Reason, tt.wantInCause)
				}
				wantAction := ActionKept
				if v == VerdictStale {
					wantAction = ActionWouldUnlink
				}
				if s.Action != wantAction {
					t.Errorf("%s: action %s, want %s (dry run)", p, s.Action, wantAction)
				}
				if !testutil.PathExists(p) {
					t.Errorf("%s: removed by a dry run", p)
				}
			}

			// With --apply exactly the stale ones go.
			cfg := fastConfig(dir)
			cfg.Apply = true
			got = sweep(t, cfg)
			for p, v := range want {
				s := got[p]
				if s == nil {
					t.Errorf("%s not found on the second sweep", p)
					continue
				}
				if v == VerdictStale {
					if s.Action != ActionUnlinked || testutil.PathExists(p) {
						t.Errorf("%s: action %s (%v), exists %v; want unlinked", p, s.Action, s.Err, testutil.PathExists(p))
					}
				} else if s.Action != ActionKept || !testutil.PathExists(p) {
					t.Errorf("%s: action %s, exists %v; want kept", p, s.Action, testutil.PathExists(p))
				}
			}
		})
	}
}

func keys(m map[string]*Socket) []string {
	var out []string
	for k, s := range m {
		out = append(out, k+"="+string(s.Verdict))
	}
	return out
}

func TestSweepHungServerIsBounded(t *testing.T) {
	dir := t.TempDir()
	k := testutil.StartKCServer(t, dir, testutil.Fake{Hang: true})
	cfg := Config{Dirs: []string{dir}, DialTimeout: 200 * time.Millisecond, Timeout: 500 * time.Millisecond, Pause: 100 * time.Millisecond, Apply: true}
	start := time.Now()
	got := sweep(t, cfg)
	elapsed := time.Since(start)
	s := got[k.Socket]
	if s == nil {
		t.Fatal("hung server's socket not reported")
	}
	if s.Verdict == VerdictStale || s.Action != ActionKept || !testutil.PathExists(k.Socket) {
		t.Errorf("hung live kcserver: verdict %s action %s (%s)", s.Verdict, s.Action, s.Reason)
	}
	// It listens, so it cannot be stale: /status is not asked twice.
	if !strings.Contains(s.Reason, "silent once") || !strings.Contains(s.Reason, "live kcserver") || len(s.tries) != 1 {
		t.Errorf("reason %q after %d tries", s.Reason, len(s.tries))
	}
	// One timeout, with generous room for a loaded machine.
	if bound := cfg.Timeout + 5*time.Second; elapsed > bound {
		t.Errorf("sweep took %v, bound %v", elapsed, bound)
	}
}

func TestSweepNeverUnlinksNonSockets(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	target := orphanSocket(t, outside, "kc-999.sock")
	if err := os.Symlink(target, filepath.Join(dir, "kc-1.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kc-2.sock"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "kc-3.sock"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "kc-4.sock"), 0o700); err != nil {
		t.Fatal(err)
	}
	foreign := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if err := os.Lchown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	// Names that are not supervisor sockets are not looked at at all.
	orphanSocket(t, dir, "kc-01f3a9c.sock")
	orphanSocket(t, dir, "other.sock")

	cfg := fastConfig(dir)
	cfg.Apply = true
	got := sweep(t, cfg)
	if len(got) != 5 {
		t.Errorf("reported %v, want the 5 kc-<pid>.sock entries", keys(got))
	}
	for _, n := range []string{"kc-1.sock", "kc-2.sock", "kc-3.sock", "kc-4.sock", filepath.Base(foreign)} {
		p := filepath.Join(dir, n)
		s := got[p]
		if s == nil {
			t.Errorf("%s not reported", n)
			continue
		}
		if s.Action != ActionKept || !testutil.PathExists(p) {
			t.Errorf("%s: action %s, exists %v (%s)", n, s.Action, testutil.PathExists(p), s.Reason)
		}
		t.Logf("%s: %s, %s: %s", n, s.Verdict, s.Action, s.Reason)
	}
	if s := got[foreign]; s != nil && (s.Verdict != VerdictStale || !strings.Contains(s.Reason, "uid 65534")) {
		t.Errorf("foreign socket: %s %q", s.Verdict, s.Reason)
	}
	if !testutil.PathExists(target) {
		t.Error("symlink target removed")
	}
}

func TestSweepWorldWritableDirAcceptsAnyOwner(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	p := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if err := os.Lchown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	got := sweep(t, fastConfig(dir))
	if s := got[p]; s == nil || s.Action != ActionWouldUnlink {
		t.Fatalf("%+v", s)
	}
}

func TestJudgeOwner(t *testing.T) {
	boot := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	atTicks := func(sec int) uint64 { return uint64(sec * ticksPerSecond) }
	created := boot.Add(100 * time.Second)
	kc := fingerprint.Identity{Stat: fingerprint.Stat{PID: 5, Comm: "kcserver", State: 'S', StartTicks: atTicks(50)}, TGID: 5}
	comms := []string{"kcserver"}
	tests := []struct {
		name string
		id   func() fingerprint.Identity
		err  error
		want say
		uid  int // the socket file's owner
	}{
		{"live kcserver started before the socket", func() fingerprint.Identity { return kc }, nil, sayLive, 0},
		{"another user's socket under its name", func() fingerprint.Identity { return kc }, nil, sayUnsure, 65534},
		{"socket of the user a setuid supervisor runs as", func() fingerprint.Identity { i := kc; i.EUID, i.SUID = 1000, 1000; return i }, nil, sayLive, 1000},
		{"socket of its real user", func() fingerprint.Identity { i := kc; i.UID = 1000; return i }, nil, sayLive, 1000},
		{"started just after, within slack", func() fingerprint.Identity { i := kc; i.StartTicks = atTicks(100) + 50; return i }, nil, sayLive, 0},
		{"started after the socket: recycled", func() fingerprint.Identity { i := kc; i.StartTicks = atTicks(102); return i }, nil, sayStale, 0},
		{"zombie", func() fingerprint.Identity { i := kc; i.State = 'Z'; return i }, nil, sayStale, 0},
		{"other comm", func() fingerprint.Identity { i := kc; i.Comm = "tokio-runtime-w"; return i }, nil, sayStale, 0},
		{"thread", func() fingerprint.Identity { i := kc; i.TGID = 4; return i }, fingerprint.ErrNotProcess, sayStale, 0},
		{"absent", func() fingerprint.Identity { return fingerprint.Identity{} }, fingerprint.ErrNotFound, sayStale, 0},
		{"unreadable", func() fingerprint.Identity { return fingerprint.Identity{} }, fingerprint.ErrMalformed, sayUnsure, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := judgeOwner(5, 5, tt.uid, false, tt.id(), tt.err, comms, created, boot)
			if got != tt.want {
				t.Errorf("got %s (%s), want %s", got, why, tt.want)
			}
		})
	}
}

func TestCompose(t *testing.T) {
	S, L, U := sayStale, sayLive, sayUnsure
	tests := []struct {
		g    [3]say
		want Verdict
	}{
		{[3]say{S, S, S}, VerdictStale},
		{[3]say{L, L, L}, VerdictLive},
		{[3]say{L, L, S}, VerdictUnknown},
		{[3]say{S, L, S}, VerdictUnknown},
		{[3]say{S, S, L}, VerdictUnknown},
		{[3]say{S, S, U}, VerdictUnknown},
		{[3]say{U, U, U}, VerdictUnknown},
	}
	for _, tt := range tests {
		if v, _ := compose(tt.g, [3]string{"a", "b", "c"}); v != tt.want {
			t.Errorf("%v: %s, want %s", tt.g, v, tt.want)
		}
	}
}

func TestOpenDirsGlobAndErrors(t *testing.T) {
	base := t.TempDir()
	for _, n := range []string{"1000", "1001"} {
		os.Mkdir(filepath.Join(base, n), 0o700)
	}
	os.WriteFile(filepath.Join(base, "file"), nil, 0o600)
	// A glob match that is a symlink to a directory elsewhere is skipped.
	os.Symlink(t.TempDir(), filepath.Join(base, "link"))
	g := pathwalk.ReadGuard("/proc", 0)
	defer g.Close()
	dirs, errs := openDirs(Target{}, g, []string{filepath.Join(base, "*"), filepath.Join(base, "1000"), filepath.Join(base, "missing"), "relative", base + "/*/x"})
	defer func() {
		for _, d := range dirs {
			d.close()
		}
	}()
	if len(dirs) != 2 {
		t.Errorf("opened %d dirs, want 2 (deduplicated, file and symlink skipped)", len(dirs))
	}
	if len(errs) != 3 {
		t.Errorf("errors %v, want 3 (missing, relative, inner wildcard)", errs)
	}
}

// TestSweepContainer runs a supervisor in a new PID namespace (as a
// container's would be) and sweeps through /proc/<init>/root with the
// namespace's PIDs.
func TestSweepContainer(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a new PID namespace")
	}
	bin := testutil.BuildKCServer(t)
	dir := t.TempDir()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command("sh", "-c", `"$0" --transport=socket --socket-dir="$1" & exec sleep 1000000`, bin, dir)
	cmd.Env = append(os.Environ(), "KCFAKE_READY_FILE="+ready, "KCFAKE_OPEN_CHANNELS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot create a PID namespace: %v", err)
	}
	initPID := cmd.Process.Pid
	t.Cleanup(func() {
		// Killing a PID namespace's init kills everything in it.
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if data, err := os.ReadFile(ready); err == nil && strings.TrimSpace(string(data)) != "" {
			if pid, _, _ := strings.Cut(string(data), "\n"); pid != "2" {
				t.Fatalf("kcserver has pid %s in its namespace, want 2", data)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fake not ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	view, err := containerView("/proc", initPID, nil)
	if err != nil {
		t.Fatal(err)
	}
	hostKC, ok, err := view.hostPID(2)
	if err != nil || !ok {
		t.Fatal("pid 2 not mapped")
	}

	// A host kcserver whose host PID names a socket inside the container:
	// on the host that PID is a live kcserver, in the container nothing.
	hostFake := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
	hostNamed := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", hostFake.PID))
	initNamed := orphanSocket(t, dir, "kc-1.sock")

	root := "/proc/" + strconv.Itoa(initPID) + "/root"
	shown := func(p string) string { return root + p }
	control := filepath.Join(dir, "kc-2.sock")
	session := filepath.Join(dir, "kc-2."+sessionTag+".sock")

	cfg := fastConfig(dir)
	cfg.Target = Target{InitPID: initPID}
	got := sweep(t, cfg)
	want := map[string]Verdict{
		shown(control):   VerdictLive,
		shown(session):   VerdictLive,
		shown(hostNamed): VerdictStale,
		shown(initNamed): VerdictStale,
	}
	for p, v := range want {
		if s := got[p]; s == nil || s.Verdict != v {
			t.Errorf("%s: %+v, want %s", p, s, v)
		}
	}
	if s := got[shown(initNamed)]; s != nil && !strings.Contains(s.Reason, `"sleep"`) {
		t.Errorf("kc-1.sock: %s", s.Reason)
	}
	// A watch round's sweeps share one listing of the namespaces: the
	// same verdicts.
	indexed := cfg
	indexed.Namespaces = NewNSIndex()
	igot := sweep(t, indexed)
	for p, v := range want {
		if s := igot[p]; s == nil || s.Verdict != v {
			t.Errorf("with an NSIndex: %s: %+v, want %s", p, s, v)
		}
	}
	if s := got[shown(hostNamed)]; s != nil && !strings.Contains(s.Reason, "in the container") {
		t.Errorf("%s: %s", hostNamed, s.Reason)
	}

	// On the host, kc-2.sock names kthreadd (or whatever has PID 2): not
	// a supervisor, yet something listens: unknown, kept.
	host := sweep(t, fastConfig(dir))
	if s := host[control]; s == nil || s.Verdict != VerdictUnknown {
		t.Errorf("host view of %s: %+v", control, s)
	}

	// SIGKILL the supervisor: its sockets become stale and go. (The
	// namespace's init, a sleep, never reaps it: it stays a zombie.)
	killPID(hostKC)
	waitDead(t, hostKC)
	cfg.Apply = true
	got = sweep(t, cfg)
	for _, p := range []string{control, session} {
		s := got[shown(p)]
		if s == nil || s.Verdict != VerdictStale || s.Action != ActionUnlinked || testutil.PathExists(p) {
			t.Errorf("%s after SIGKILL: %+v", p, s)
		}
	}
	if s := got[shown(control)]; s != nil && !strings.Contains(s.Reason, "zombie") {
		t.Errorf("reason %q, want the zombie named", s.Reason)
	}
}

func TestSweepContextCancelled(t *testing.T) {
	dir := t.TempDir()
	orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	hashed := orphanSocket(t, dir, hashedName)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := fastConfig(dir)
	cfg.Apply = true
	cfg.Now = agedAt(t, hashed, time.Hour) // old enough: only the probes are missing
	rep, err := Sweep(ctx, cfg)
	if err == nil {
		t.Fatal("no error from a cancelled sweep")
	}
	if len(rep.Sockets) != 2 {
		t.Errorf("%d sockets reported, want 2", len(rep.Sockets))
	}
	for _, s := range rep.Sockets {
		if s.Verdict == VerdictStale || !testutil.PathExists(s.Path) {
			t.Errorf("%s judged %s without probing (%s)", s.Path, s.Verdict, s.Reason)
		}
	}
}

// Benchmark: 1000 sockets, half stale, 10 hung supervisors. Live ones are
// session sockets of 5 fake supervisors (98 sessions each) plus their
// control sockets; stale ones are 250 orphans named after dead PIDs plus
// the control and session sockets of 5 SIGKILLed fakes.
func BenchmarkSweep1000(b *testing.B) {
	dir := b.TempDir()
	sessFile := func(n int) string {
		var parts []string
		for i := 0; i < n; i++ {
			parts = append(parts, fmt.Sprintf(`{"session_id":"s%07d-x","status":"idle","connected":false,"idle_seconds":1}`, i))
		}
		f := filepath.Join(b.TempDir(), "s.json")
		os.WriteFile(f, []byte("["+strings.Join(parts, ",")+"]"), 0o644)
		return f
	}
	live := sessFile(97) // 5 × (1 + 97) = 490
	for i := 0; i < 5; i++ {
		testutil.StartKCServer(b, dir, testutil.Fake{OpenChannels: true, Sessions: live})
	}
	for i := 0; i < 10; i++ { // 10 hung control sockets: 500 not stale
		testutil.StartKCServer(b, dir, testutil.Fake{Hang: true})
	}
	dead := sessFile(49) // 5 × (1 + 49) = 250 stale
	for i := 0; i < 5; i++ {
		k := testutil.StartKCServer(b, dir, testutil.Fake{OpenChannels: true, Sessions: dead})
		k.Kill(b)
	}
	seen := map[int]bool{}
	for n := 0; n < 250; {
		pid := deadPID(b)
		if seen[pid] {
			continue
		}
		seen[pid] = true
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, fmt.Sprintf("kc-%d.sock", pid)), Net: "unix"})
		if err != nil {
			continue
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		n++
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1000 {
		b.Fatalf("%d sockets, want 1000", len(ents))
	}
	cfg := Config{Dirs: []string{dir}} // default timeouts, workers
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rep, err := Sweep(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		n := map[Verdict]int{}
		for _, s := range rep.Sockets {
			n[s.Verdict]++
		}
		if n[VerdictStale] != 500 || n[VerdictLive] != 490 || n[VerdictUnknown] != 10 {
			b.Fatalf("verdicts %v", n)
		}
	}
}

// TestContainerRootConfinesSymlinks runs the fake supervisor chrooted
// into a directory whose /tmp is an absolute symlink and whose /escape
// points at /etc: through /proc/<pid>/root both must resolve inside the
// chroot, never on the host.
func TestContainerRootConfinesSymlinks(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for chroot")
	}
	root := t.TempDir()
	data, err := os.ReadFile(testutil.BuildKCServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "kcserver"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(root, "inside"), 0o700)
	os.Symlink("/inside", filepath.Join(root, "tmp"))
	os.Symlink("/etc", filepath.Join(root, "escape"))
	// A mount inside (as a build chroot's /proc): the chroot's own table
	// shows it, and not the mount that holds the root.
	testutil.MountTmpfs(t, root, "mnt")
	cmd := exec.Command("/kcserver", "--transport=socket", "--socket-dir=/inside")
	cmd.Env = []string{"KCFAKE_READY_FILE=/inside/ready"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(15 * time.Second)
	for !testutil.PathExists(filepath.Join(root, "inside", "ready")) {
		if time.Now().After(deadline) {
			t.Fatal("chrooted fake not ready")
		}
		time.Sleep(5 * time.Millisecond)
	}

	tg := Target{InitPID: cmd.Process.Pid}
	g := pathwalk.ReadGuard("/proc", tg.InitPID)
	defer g.Close()
	dirs, errs := openDirs(tg, g, []string{"/tmp", "/escape", "/ins*"})
	defer func() {
		for _, d := range dirs {
			d.close()
		}
	}()
	var inside unix.Stat_t
	unix.Stat(filepath.Join(root, "inside"), &inside)
	if len(dirs) != 1 || dirs[0].ino != inside.Ino {
		t.Errorf("opened %d dirs, want only <root>/inside (deduplicated)", len(dirs))
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "/escape") {
		t.Errorf("errors %v, want /escape not found inside the root", errs)
	}

	cfg := fastConfig("/tmp")
	cfg.Target = tg
	got := sweep(t, cfg)
	p := fmt.Sprintf("/proc/%d/root/tmp/kc-%d.sock", cmd.Process.Pid, cmd.Process.Pid)
	if s := got[p]; s == nil || s.Verdict != VerdictLive {
		t.Errorf("%s: %+v (%v)", p, s, keys(got))
	}
}

// TestNSIndexIsCheckedAtUse: a view taken from an index older than the
// sweep maps a PID only to the process that holds it in the namespace
// now: one started since is found by walking /proc after all, one gone
// since is not mapped to whatever took its host PID.
func TestNSIndexIsCheckedAtUse(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a new PID namespace")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("no nsenter")
	}
	init := exec.Command("sleep", "1000000")
	init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := init.Start(); err != nil {
		t.Skipf("cannot create a PID namespace: %v", err)
	}
	t.Cleanup(func() {
		init.Process.Kill() // and with it the namespace
		init.Wait()
	})
	idx := NewNSIndex()
	idx.maxAge = time.Hour // young for as long as the test needs
	view, err := containerView("/proc", init.Process.Pid, idx)
	if err != nil {
		t.Fatal(err)
	}
	if !view.indexed {
		t.Fatal("the view was not taken from the index")
	}
	if h, ok, err := view.hostPID(1); err != nil || !ok || h != init.Process.Pid {
		t.Fatalf("pid 1 maps to %d, %v, %v; want %d", h, ok, err, init.Process.Pid)
	}

	// Started in the namespace after the index was listed.
	late := exec.Command("nsenter", "--target", strconv.Itoa(init.Process.Pid), "--pid", "--", "sh", "-c", "echo $$; exec sleep 1000000")
	out, err := late.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { late.Process.Kill(); late.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	inner, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	// A view taken from the index again lacks it while the index is
	// young; one older than its bound is listed again.
	if v, err := containerView("/proc", init.Process.Pid, idx); err != nil || !v.indexed || v.hostOf[inner] != 0 {
		t.Errorf("a young index was listed again: %v, %+v", err, v)
	}
	idx.maxAge = 0
	if v, err := containerView("/proc", init.Process.Pid, idx); err != nil || !v.indexed || v.hostOf[inner] == 0 {
		t.Errorf("an old index was not listed again: %v, %+v", err, v)
	}
	h, ok, err := view.hostPID(inner)
	if still, serr := stillIn("/proc", h, inner, view.ns); err != nil || !ok || !still || serr != nil {
		t.Fatalf("pid %d, started after the index: maps to %d, %v, %v", inner, h, ok, err)
	}

	// Gone since: its host PID is no process of the namespace.
	view, err = containerView("/proc", init.Process.Pid, idx)
	if err != nil {
		t.Fatal(err)
	}
	view.hostOf[inner] = h // as an index listed after it started would
	view.indexed = true
	killPID(h)
	// Dead is not yet out of the namespace: an exiting task keeps its
	// namespaces a moment after its stat stops saying it runs.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Readlink("/proc/" + strconv.Itoa(h) + "/ns/pid"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still in its namespace 10s after SIGKILL", h)
		}
	}
	if slices.Contains(view.hostPIDs(), h) {
		t.Errorf("discovery would read host pid %d, gone from the namespace", h)
	}
	if h2, ok, err := view.hostPID(inner); err != nil || ok {
		t.Errorf("pid %d, gone: maps to %d, %v, %v; want not found", inner, h2, ok, err)
	}
}

// TestPlantedSocketIsNotTheSupervisors: another user binds the free name
// kc-<pid>.sock of a live supervisor that keeps its socket elsewhere and
// answers /status with that PID. The socket is not the supervisor's (its
// process could not have made it): not live, so cull never audits what
// answers there as that supervisor.
func TestPlantedSocketIsNotTheSupervisors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a supervisor of one user, a socket of another")
	}
	kc := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{})
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", kc.PID))
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/status":
			fmt.Fprintf(w, `{"process_id":%d,"sessions":1,"active":0,"busy":false,"version":"0.1"}`, kc.PID)
		default:
			fmt.Fprint(w, `{"total":1,"sessions":[{"session_id":"made-up","status":"idle","connected":false,"idle_seconds":999999}]}`)
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	s := sweep(t, fastConfig(dir))[p]
	if s == nil {
		t.Fatal("planted socket not found")
	}
	if s.Verdict != VerdictUnknown || s.Action != ActionKept || !strings.Contains(s.Reason, "not its socket") {
		t.Errorf("planted socket: %s, %s (%s); want unknown and kept, not its socket", s.Verdict, s.Action, s.Reason)
	}
}

// TestSweepRefusesARecycledTarget: a container target is held by its
// init's start time as resolved; a PID that names another process by the
// time the sweep starts (the container stopped, the number reused) is
// refused before anything is looked up through it.
func TestSweepRefusesARecycledTarget(t *testing.T) {
	pid := startSleep(t)
	st, err := fingerprint.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	cfg := fastConfig(dir)
	cfg.Apply = true
	cfg.Target = Target{InitPID: pid, StartTicks: st.StartTicks + 1}
	if rep, err := Sweep(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "not the process") {
		t.Errorf("Sweep = %+v, %v; want the recycled init refused", rep, err)
	}
	if !testutil.PathExists(p) {
		t.Error("a socket was unlinked through a recycled target")
	}
}

// TestSweepUnlinksEveryNameOfAStaleSocket: a stale socket file with two
// names (a hard link) loses both in one run; unlinking the first moves
// the file's change time, which must not make the second look like
// another socket.
func TestSweepUnlinksEveryNameOfAStaleSocket(t *testing.T) {
	dir := t.TempDir()
	first := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	second := filepath.Join(dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if err := os.Link(first, second); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(dir)
	cfg.Apply = true
	got := sweep(t, cfg)
	for _, p := range []string{first, second} {
		if s := got[p]; s == nil || s.Action != ActionUnlinked || testutil.PathExists(p) {
			t.Errorf("%s: %+v, exists %v; want unlinked", p, s, testutil.PathExists(p))
		}
	}
}

// TestOwnerListens: a control socket cull audits though the sweep left it
// unknown is one named for a live supervisor of its owner, listening,
// whose /status never answered (slow); one that answered as another
// server, or as no Kallichore, is not that supervisor.
func TestOwnerListens(t *testing.T) {
	L, U := sayLive, sayUnsure
	silent := statusTry{}
	for _, tc := range []struct {
		name   string
		gates  [3]say
		tries  []statusTry
		hashed bool
		want   bool
	}{
		{"slow: silent once", [3]say{L, L, U}, []statusTry{silent}, false, true},
		{"not probed", [3]say{L, L, U}, nil, false, true},
		{"another server's process_id", [3]say{L, L, U}, []statusTry{{answered: true, pid: 31000}}, false, false},
		{"not Kallichore", [3]say{L, L, U}, []statusTry{{answered: true, other: "HTTP 404"}}, false, false},
		{"owner unsure", [3]say{U, L, U}, []statusTry{silent}, false, false},
		{"not listening", [3]say{L, U, U}, []statusTry{silent}, false, false},
		{"hashed", [3]say{L, L, U}, []statusTry{silent}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Socket{Hashed: tc.hashed, gates: tc.gates, tries: tc.tries}
			if got := s.OwnerListens(); got != tc.want {
				t.Errorf("OwnerListens = %v, want %v", got, tc.want)
			}
		})
	}
}
