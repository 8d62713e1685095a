package sweep

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/pathwalk"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

const nobody = 65534

// worldDir is a private directory as /tmp is: world-writable and sticky,
// so that another user can leave sockets in it.
func worldDir(t *testing.T) string {
	t.Helper()
	d := shortTemp(t)
	if err := os.Chmod(d, 0o1777); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSweepDeadline: another user's 640 listening sockets that never
// answer, hard-linked under 640 kc-N.sock names or all distinct, cannot
// hold a sweep past its deadline. Hard links are probed once (so they
// all get a verdict well within it); distinct ones not probed in time are
// unknown, kept, and say why. An orphan next to the hard links is still
// unlinked.
func TestSweepDeadline(t *testing.T) {
	const (
		n        = 640
		deadline = 2 * time.Second
		// Slack for a loaded machine: the run must end near the deadline,
		// not at the 640/64 timeouts (15 s) it took before.
		slack = 2 * time.Second
	)
	for _, links := range []bool{true, false} {
		t.Run(fmt.Sprintf("hard links %v", links), func(t *testing.T) {
			dir := worldDir(t)
			testutil.StartSockServer(t, dir, testutil.SockServer{N: n, First: 4000000, Links: links, UID: nobody})
			orphan := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))

			cfg := fastConfig(dir)
			cfg.Apply = true
			cfg.Deadline = deadline
			// Well inside the deadline: a hung probe that times out late on
			// a loaded machine still gives its verdict to every hard link.
			cfg.Timeout = time.Second
			start := time.Now()
			rep, err := Sweep(context.Background(), cfg)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d sockets swept in %v, %d not probed", len(rep.Sockets), took.Round(time.Millisecond), rep.Unprobed)
			if took > deadline+slack {
				t.Errorf("sweep took %v, want at most the %v deadline (+%v slack)", took, deadline, slack)
			}
			hung := 0
			for _, s := range rep.Sockets {
				if s.Path == orphan {
					continue
				}
				hung++
				if s.Verdict != VerdictUnknown || s.Action != ActionKept || !testutil.PathExists(s.Path) {
					t.Errorf("%s: %s, %s (%s): want unknown and kept", s.Path, s.Verdict, s.Action, s.Reason)
				}
				if links && strings.Contains(s.Reason, "not probed") {
					t.Errorf("%s: %s: a hard link of a probed socket shares its verdict", s.Path, s.Reason)
				}
			}
			if hung != n {
				t.Errorf("%d hung sockets in the report, want %d", hung, n)
			}
			switch {
			case links && rep.Unprobed != 0:
				t.Errorf("%d not probed, want 0: one probe serves every hard link", rep.Unprobed)
			case !links && rep.Unprobed == 0:
				t.Errorf("every distinct hung socket was probed within %v: the test proves nothing", deadline)
			}
			if !links {
				i := slices.IndexFunc(rep.Sockets, func(s *Socket) bool { return strings.Contains(s.Reason, "not probed") })
				if i < 0 || !strings.Contains(rep.Sockets[i].Reason, "deadline (2s) passed") {
					t.Errorf("no socket says the deadline passed")
				}
			}
			if links && testutil.PathExists(orphan) {
				t.Errorf("orphan %s next to the hard links was not unlinked", orphan)
			}
		})
	}
}

// mountFUSE mounts an unserved FUSE file system of another user over
// dir/name (testutil.MountFUSE). Without allowOther root's lstat of it
// fails with EACCES; with it, any access of root's that asks the server
// waits until the test ends.
func mountFUSE(t *testing.T, dir, name string, allowOther bool) string {
	t.Helper()
	if allowOther {
		return testutil.MountFUSE(t, dir, name, "allow_other")
	}
	p := testutil.MountFUSE(t, dir, name, "")
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != syscall.EACCES {
		t.Fatalf("lstat of the FUSE mount: %v, want EACCES", err)
	}
	return p
}

// TestUnreadableEntry: a FUSE mount named kc-1.sock that root cannot even
// lstat is reported as unknown for itself; the orphan next to it is
// found and unlinked, and the directory is not an error.
func TestUnreadableEntry(t *testing.T) {
	dir := shortTemp(t)
	fuse := mountFUSE(t, dir, "kc-1.sock", false)
	orphan := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))

	cfg := fastConfig(dir)
	cfg.Apply = true
	got := sweep(t, cfg) // fails the test on any directory error
	if s := got[orphan]; s == nil || s.Action != ActionUnlinked || testutil.PathExists(orphan) {
		t.Errorf("orphan next to the unreadable entry: %+v", s)
	}
	s := got[fuse]
	if s == nil || s.Verdict != VerdictUnknown || s.Action != ActionKept || !strings.Contains(s.Reason, "FUSE mount of uid") {
		t.Errorf("unreadable entry: %+v, want unknown and kept, saying why", s)
	}
}

// TestFUSEMountsAreNotEntered: a user's FUSE mount whose server never
// answers, mounted with allow_other so that root's accesses do reach it,
// as an entry named like a socket and as a socket directory: the sweep
// lists, judges and reports the rest, within its bounds, and says why it
// entered neither. Any lookup, open or lstat in the mount would wait for
// ever.
func TestFUSEMountsAreNotEntered(t *testing.T) {
	dir := shortTemp(t)
	entry := mountFUSE(t, dir, "kc-1.sock", true)
	orphan := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	asDir := mountFUSE(t, shortTemp(t), "sockets", true)

	type result struct {
		rep *Report
		err error
	}
	r := testutil.Within(t, 30*time.Second, "the sweep, beside FUSE mounts", func() result {
		cfg := fastConfig(dir, asDir, filepath.Join(asDir, "sub"))
		cfg.Deadline = 5 * time.Second
		rep, err := Sweep(context.Background(), cfg)
		return result{rep, err}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	rep := r.rep
	got := map[string]*Socket{}
	for _, s := range rep.Sockets {
		got[s.Path] = s
	}
	if s := got[orphan]; s == nil || s.Verdict != VerdictStale {
		t.Errorf("orphan next to the FUSE mount: %+v", s)
	}
	if s := got[entry]; s == nil || s.Verdict != VerdictUnknown || !strings.Contains(s.Reason, "FUSE mount of uid") {
		t.Errorf("the FUSE mount named like a socket: %+v, want unknown, saying why", s)
	}
	var refused []string
	for _, e := range rep.DirErrors {
		if errors.Is(e, pathwalk.ErrOnFUSE) {
			refused = append(refused, e.Error())
		}
	}
	if len(refused) != 2 {
		t.Errorf("want the FUSE directory and one under it refused, got %q (all: %v)", refused, rep.DirErrors)
	}
}

// startFakeAs starts the fake kcserver as uid with args and env, its comm
// set to comm, and returns its PID once it is ready.
func startFakeAs(t *testing.T, uid int, comm string, args, env []string) int {
	t.Helper()
	bin := testutil.BuildKCServer(t)
	pub := shortTemp(t)
	if err := os.Chmod(pub, 0o777); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(pub, "kcserver")
	if err := testutil.CopyFile(bin, run, 0o755); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(pub, "ready")
	cmd := exec.Command(run, append([]string{"--transport=socket"}, args...)...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "KCFAKE_READY_FILE=" + ready, "KCFAKE_COMM=" + comm}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			return cmd.Process.Pid
		}
		select {
		case <-exited:
			t.Fatalf("fake kcserver exited: %s", stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake kcserver not ready: %s", stderr.String())
		}
	}
}

// TestDiscoveredDirsRules: a process named like a supervisor, run by
// another user, names as its socket directories a symlink into a
// root-only directory (--socket-dir), a directory of a third user
// (XDG_RUNTIME_DIR) and a file (TMPDIR=/etc/passwd). Root's sweep --apply
// unlinks in none of them, reports each as refused with why, and does not
// fail; the directory of its own that it really uses is swept.
func TestDiscoveredDirsRules(t *testing.T) {
	const comm = "kcsrv-disc-uid"
	rootOnly := shortTemp(t) // 0700, root's
	inRootOnly := orphanSocket(t, rootOnly, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	third := shortTemp(t)
	inThird := orphanSocket(t, third, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	for _, p := range []string{third, inThird} {
		if err := os.Lchown(p, 12345, 12345); err != nil {
			t.Fatal(err)
		}
	}
	own := shortTemp(t)
	if err := os.Chown(own, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(own, "sockets")
	if err := os.Symlink(rootOnly, link); err != nil {
		t.Fatal(err)
	}
	ownOrphan := orphanSocket(t, own, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if err := os.Lchown(ownOrphan, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	startFakeAs(t, nobody, comm, []string{"--unix-socket=" + own + "/c.sock", "--socket-dir=" + link},
		[]string{"XDG_RUNTIME_DIR=" + third, "TMPDIR=/etc/passwd"})

	cfg := fastConfig()
	cfg.SupervisorComms = []string{comm}
	cfg.defaultDirs = []string{shortTemp(t)} // not /tmp: this run applies
	cfg.Apply = true
	got := sweep(t, cfg) // fails the test on any directory error
	for _, p := range []string{inRootOnly, inThird} {
		if !testutil.PathExists(p) {
			t.Errorf("%s was unlinked through a directory a user's process named", p)
		}
	}
	if s := got[ownOrphan]; s == nil || s.Action != ActionUnlinked {
		t.Errorf("the process's own directory, owned by its uid, was not swept: %+v", s)
	}
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for dir, why := range map[string]string{link: "is a symlink", third: "owned by uid 12345", "/etc/passwd": "not a directory"} {
		i := slices.IndexFunc(rep.Dirs, func(d Dir) bool { return d.Path == dir })
		if i < 0 || !strings.Contains(rep.Dirs[i].Refused, why) {
			t.Errorf("dir %s: %+v, want refused with %q", dir, rep.Dirs, why)
		}
	}
}

// TestDiscoveredDirsTheNamerCouldUse: a user's process that names, with
// no symlink, a root-only directory, or a world-writable one it cannot
// reach (another container's /tmp below /var/lib), does not have root
// sweep it; its own directory is swept.
func TestDiscoveredDirsTheNamerCouldUse(t *testing.T) {
	const comm = "kcsrv-disc-rch"
	rootOnly := shortTemp(t) // 0700, root's
	inRootOnly := orphanSocket(t, rootOnly, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	hidden := filepath.Join(shortTemp(t), "tmp") // a 1777 dir below a 0700 one
	if err := os.Mkdir(hidden, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(hidden, 0o1777); err != nil {
		t.Fatal(err)
	}
	inHidden := orphanSocket(t, hidden, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	own := shortTemp(t)
	if err := os.Chown(own, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	ownOrphan := orphanSocket(t, own, fmt.Sprintf("kc-%d.sock", deadPID(t)))
	if err := os.Lchown(ownOrphan, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	startFakeAs(t, nobody, comm, []string{"--unix-socket=" + own + "/c.sock", "--socket-dir=" + rootOnly},
		[]string{"XDG_RUNTIME_DIR=" + own, "TMPDIR=" + hidden})

	cfg := fastConfig()
	cfg.SupervisorComms = []string{comm}
	cfg.defaultDirs = []string{shortTemp(t)}
	cfg.Apply = true
	got := sweep(t, cfg)
	for _, p := range []string{inRootOnly, inHidden} {
		if !testutil.PathExists(p) {
			t.Errorf("%s was unlinked through a directory its namer could not use", p)
		}
	}
	if s := got[ownOrphan]; s == nil || s.Action != ActionUnlinked {
		t.Errorf("the process's own directory was not swept: %+v", s)
	}
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for dir, why := range map[string]string{rootOnly: "may write it", hidden: "not searchable"} {
		i := slices.IndexFunc(rep.Dirs, func(d Dir) bool { return d.Path == dir })
		if i < 0 || !strings.Contains(rep.Dirs[i].Refused, why) {
			t.Errorf("dir %s: %+v, want refused with %q", dir, rep.Dirs, why)
		}
	}
}
