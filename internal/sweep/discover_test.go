package sweep

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func TestFlagValues(t *testing.T) {
	tests := []struct {
		argv []string
		want map[string]string
	}{
		{[]string{"kcserver", "--socket-dir", "/a", "--unix-socket=/b/c.sock"}, map[string]string{"--socket-dir": "/a", "--unix-socket": "/b/c.sock"}},
		{[]string{"kcserver", "--socket-dir=/a"}, map[string]string{"--socket-dir": "/a"}},
		{[]string{"kcserver", "--socket-dir"}, map[string]string{}},
		{[]string{"kcserver", "--socket-directory=/x", "--", "--socket-dir=/y"}, map[string]string{}},
		{[]string{"--socket-dir=/argv0-is-not-a-flag"}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.argv, " "), func(t *testing.T) {
			got := flagValues(tt.argv, socketFlags)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSweepLearnsHostDirs: with no directories given, sweep looks in the
// --socket-dir of a live kcserver's argv and in the XDG_RUNTIME_DIR and
// TMPDIR of its environment, and says so; a relative or globbing value is
// not followed.
func TestSweepLearnsHostDirs(t *testing.T) {
	// A comm of this test's own: discovery and the owner gate then see
	// only this test's supervisor.
	const comm = "kcsrv-discover"
	argvDir, xdg, tmp := shortTemp(t), shortTemp(t), shortTemp(t)
	k := testutil.StartKCServer(t, argvDir, testutil.Fake{Comm: comm, OpenChannels: true,
		Env: []string{"XDG_RUNTIME_DIR=" + xdg, "TMPDIR=" + tmp}})
	stale := []string{
		orphanSocket(t, argvDir, fmt.Sprintf("kc-%d.sock", deadPID(t))),
		orphanSocket(t, xdg, fmt.Sprintf("kc-%d.sock", deadPID(t))),
		orphanSocket(t, tmp, fmt.Sprintf("kc-%d.sock", deadPID(t))),
	}

	cfg := fastConfig()
	cfg.SupervisorComms = []string{comm}
	rep, err := Sweep(context.Background(), cfg) // a dry run: the host's own dirs are swept too
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Socket{}
	for _, s := range rep.Sockets {
		got[s.Path] = s
	}
	if s := got[k.Socket]; s == nil || s.Verdict != VerdictLive {
		t.Errorf("the live kcserver's socket in its --socket-dir: %+v", s)
	}
	for _, p := range stale {
		if s := got[p]; s == nil || s.Verdict != VerdictStale || s.Action != ActionWouldUnlink {
			t.Errorf("%s: %+v, want stale (would-unlink)", p, s)
		}
	}
	who := fmt.Sprintf("%s %d ", comm, k.PID)
	for dir, src := range map[string]string{argvDir: who + "--socket-dir", xdg: who + "XDG_RUNTIME_DIR", tmp: who + "TMPDIR", "/tmp": "default"} {
		i := slices.IndexFunc(rep.Dirs, func(d Dir) bool { return d.Path == dir })
		if i < 0 || !slices.Contains(rep.Dirs[i].Sources, src) {
			t.Errorf("dirs lack %s from %q: %+v", dir, src, rep.Dirs)
		}
	}
}

func TestDiscoverSkipsRelativeAndGlobs(t *testing.T) {
	const comm = "kcsrv-disc-bad"
	k := testutil.StartKCServer(t, "", testutil.Fake{Comm: comm, Args: []string{"--unix-socket=" + shortTemp(t) + "/c.sock"},
		Env: []string{"XDG_RUNTIME_DIR=relative/dir", "TMPDIR=/tmp/*"}})
	set := newDirSet(func(uid int) int { return uid }, nil)
	discoverDirs(hostView("/proc"), Target{}, []string{comm}, set)
	found := set.dirs()
	if len(found) != 1 || !strings.HasSuffix(k.Socket, "/c.sock") || found[0].Path+"/c.sock" != k.Socket {
		t.Errorf("found %+v, want only the --unix-socket's directory of %s", found, k.Socket)
	}
}

// shortTemp is a temporary directory with a short path (sun_path is 108
// bytes).
func shortTemp(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kcd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestDirSetBounds: one user's supervisors add at most maxDirsPerOwner
// directories, his subordinate UIDs' counted as his, and all of them
// maxDiscoveredDirs; a directory already named still takes the sources
// and owners of those past the bound, and a default one costs nothing.
func TestDirSetBounds(t *testing.T) {
	subs := subIDs{{start: 100000, count: 65536, owner: 1000}}
	s := newDirSet(subs.owner, []string{"/tmp", "/run/user/*"})
	s.add("/tmp", "kcserver 9 TMPDIR", 1000)
	s.add("/run/user/1000", "kcserver 9 XDG_RUNTIME_DIR", 1000)
	for i := range maxDirsPerOwner + 3 {
		// Each named by another of the user's subordinate UIDs.
		s.add(fmt.Sprintf("/dev/shm/u1000/d%d", i), "kcserver 10 --socket-dir", 100000+i)
	}
	s.add("/dev/shm/u1000/d9", "kcserver 10 TMPDIR", 1000) // left out already: counted once
	s.add("/run/user/1001", "kcserver 11 XDG_RUNTIME_DIR", 1001)
	s.add("/dev/shm/u1000/d0", "kcserver 12 TMPDIR", 1001)
	s.add("/dev/shm/u1000/d0", "kcserver 13 TMPDIR", 1000)
	for i := range maxDiscoveredDirs {
		s.add(fmt.Sprintf("/home/u%d/kc", 2000+i), "kcserver 14 --socket-dir", 2000+i)
	}
	dirs := s.dirs()
	mine := 0
	for _, d := range dirs {
		if strings.HasPrefix(d.Path, "/dev/shm/u1000/") {
			mine++
		}
	}
	if mine != maxDirsPerOwner {
		t.Errorf("%d of uid 1000's directories kept, want %d", mine, maxDirsPerOwner)
	}
	// The three under the defaults' patterns are free; the rest are
	// bounded in all: uid 1000's took 8 of the 256, so the last 8 other
	// users' are left out.
	if got := len(dirs); got != maxDiscoveredDirs+3 {
		t.Errorf("%d directories, want the bound %d and the three under the defaults", got, maxDiscoveredDirs)
	}
	if n, users, some := s.droppedNote(); n != 3+maxDirsPerOwner || users != 1+maxDirsPerOwner || some[0] != 1000 {
		t.Errorf("dropped %d directories of %d users (%v), want uid 1000's 3 and one each of %d others", n, users, some, maxDirsPerOwner)
	}
	i := slices.IndexFunc(dirs, func(d Dir) bool { return d.Path == "/dev/shm/u1000/d0" })
	if i < 0 {
		t.Fatalf("the first directory named is gone: %+v", dirs)
	}
	if !slices.Equal(dirs[i].owners, []int{100000, 1001, 1000}) || len(dirs[i].Sources) != 3 {
		t.Errorf("a directory named again: %+v, want its three owners and sources", dirs[i])
	}
}

// TestDirSetBoundsFreeOnes: directories under the defaults' patterns are
// not counted in all, but one user adds at most maxDirsPerOwner of them
// (/run/user/<any name> matches /run/user/*), and the ones left out are
// remembered by name up to maxDropped.
func TestDirSetBoundsFreeOnes(t *testing.T) {
	s := newDirSet(func(uid int) int { return uid }, []string{"/tmp", "/run/user/*"})
	for i := range 10000 {
		s.add(fmt.Sprintf("/run/user/x%d", i), "kcserver 9 XDG_RUNTIME_DIR", 1000)
	}
	if n := len(s.dirs()); n != maxDirsPerOwner {
		t.Errorf("%d directories kept, want %d", n, maxDirsPerOwner)
	}
	if n, _, _ := s.droppedNote(); n != 10000-maxDirsPerOwner || len(s.dropped) > maxDropped {
		t.Errorf("%d left out (%d by name), want %d (at most %d by name)", n, len(s.dropped), 10000-maxDirsPerOwner, maxDropped)
	}
}

// TestDiscoverInitDirsAlways: a container's init's TMPDIR and
// XDG_RUNTIME_DIR are looked in whatever else runs there: a process named
// like a supervisor in the container (anyone's) does not switch them off.
func TestDiscoverInitDirsAlways(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a new PID namespace")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("no nsenter")
	}
	init := exec.Command("sleep", "1000000")
	init.Env = []string{"TMPDIR=/scratch-of-the-init"}
	init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := init.Start(); err != nil {
		t.Skipf("cannot create a PID namespace: %v", err)
	}
	t.Cleanup(func() { init.Process.Kill(); init.Wait() })
	other := exec.Command("nsenter", "--target", strconv.Itoa(init.Process.Pid), "--pid", "--", "sh", "-c", "echo ready; sleep 1000000")
	other.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	view, err := containerView("/proc", init.Process.Pid, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := newDirSet(func(uid int) int { return uid }, nil)
	discoverDirs(view, Target{InitPID: init.Process.Pid}, []string{"sh"}, set)
	if !slices.ContainsFunc(set.dirs(), func(d Dir) bool { return d.Path == "/scratch-of-the-init" }) {
		t.Errorf("the init's TMPDIR not looked in beside a process named sh: %+v", set.dirs())
	}
}

// TestDiscoverOnTheHostSkipsOtherPIDNamespaces: on the host, a process of
// another PID namespace (a pod's) does not add the directories it names,
// whose sockets carry PIDs the host cannot judge (and would fill the
// bounds); one of the host's does.
func TestDiscoverOnTheHostSkipsOtherPIDNamespaces(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a new PID namespace")
	}
	start := func(dir string, flags uintptr) {
		cmd := exec.Command("sleep", "1000000")
		cmd.Env = []string{"TMPDIR=" + dir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
		if err := cmd.Start(); err != nil {
			t.Skipf("cannot start: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	start("/named-in-another-pid-ns", syscall.CLONE_NEWPID)
	start("/named-on-the-host", 0)
	set := newDirSet(func(uid int) int { return uid }, nil)
	discoverDirs(hostView("/proc"), Target{}, []string{"sleep"}, set)
	has := func(p string) bool { return slices.ContainsFunc(set.dirs(), func(d Dir) bool { return d.Path == p }) }
	if has("/named-in-another-pid-ns") || !has("/named-on-the-host") {
		t.Errorf("found %+v; want the host's process's directory, not the other namespace's", set.dirs())
	}
}
