package proctable

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable/taskiter"
)

// startAs runs sleep under the name comm (exec'd through a copy of that
// name: comm is the executable's base name), leading its own group or
// not, and stops it with the test.
func startAs(t *testing.T, comm string, ownGroup bool) int {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: ownGroup}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// TestWatchedAll: a watched process is in WatchedAll whether it leads its
// group or not and whichever lister listed it, with the same identity;
// the task iterator's listing gives its parent and real UID, which stat
// and status agree with, and the /proc listing reads only what it did
// not see.
func TestWatchedAll(t *testing.T) {
	leader := startAs(t, "conmon", true)
	member := startAs(t, "containerd-shim", false)
	watch := func(comm []byte) bool {
		return string(comm) == "conmon" || string(comm) == "containerd-shim"
	}
	want := map[int]fingerprint.Identity{}
	for _, pid := range []int{leader, member} {
		id, err := fingerprint.Read(fingerprint.DefaultRoot, pid)
		if err != nil {
			t.Fatal(err)
		}
		want[pid] = id
	}
	for _, lister := range []Lister{ListProc, ListBPF} {
		t.Run(lister.String(), func(t *testing.T) {
			l, err := List(Options{Lister: lister, Watch: watch})
			if taskiter.Unsupported(err) {
				t.Skipf("task iterator not usable here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := NewReader(fingerprint.DefaultRoot)
			defer r.Close()
			all, err := l.WatchedAll(r)
			if err != nil {
				t.Fatal(err)
			}
			for pid, id := range want {
				i := slices.IndexFunc(all, func(p Proc) bool { return p.PID == pid })
				if i < 0 {
					t.Fatalf("%d (%s) missing from WatchedAll %+v", pid, id.Comm, all)
				}
				p := all[i]
				if p.Comm != id.Comm || p.StartTicks != id.StartTicks || p.PGID != id.PGID || p.PPID != id.PPID || p.Zombie {
					t.Errorf("%d: %+v, want comm %q start %d pgid %d ppid %d, alive", pid, p, id.Comm, id.StartTicks, id.PGID, id.PPID)
				}
				wantUID := -1
				if lister == ListBPF {
					wantUID = id.UID
				}
				if p.UID != wantUID {
					t.Errorf("%d: UID %d, want %d", pid, p.UID, wantUID)
				}
				j := l.Index(pid)
				if j < 0 || int(l.PGIDs[j]) != id.PGID {
					t.Fatalf("Index(%d) = %d", pid, j)
				}
				if lister == ListBPF && (int(l.PPIDs[j]) != id.PPID || int(l.UIDs[j]) != id.UID || l.Starts[j] != id.StartTicks) {
					t.Errorf("%d: listed ppid %d uid %d start %d, want %d %d %d", pid, l.PPIDs[j], l.UIDs[j], l.Starts[j], id.PPID, id.UID, id.StartTicks)
				}
			}
			seen := slices.IndexFunc(l.Watched, func(p Proc) bool { return p.PID == member }) >= 0
			if seen != (lister == ListBPF) {
				t.Errorf("the group member in Watched: %v; the task iterator sees every comm, the /proc pass only leaders'", seen)
			}
			if lister == ListProc && l.PPIDs != nil {
				t.Errorf("a /proc listing carries PPIDs it never read")
			}
		})
	}
}

// TestWatchedAllUnreadableIsAnError: a process whose stat cannot be read
// (other than gone) may be a watched one, a container's monitor: left
// out, its absence would be taken for evidence of none. WatchedAll says
// so; a process gone since is passed over.
func TestWatchedAllUnreadableIsAnError(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "200", "stat"), 0o755); err != nil {
		t.Fatal(err) // a stat that cannot be read: EISDIR
	}
	watch := func([]byte) bool { return true }
	r := NewReader(root)
	defer r.Close()
	l := &Listing{PIDs: []int{200}, PGIDs: []int32{200}, Leaders: []Leader{{PID: 200, State: Unreadable}}, watch: watch}
	if all, err := l.WatchedAll(r); err == nil {
		t.Errorf("WatchedAll = %+v, nil; want an error for the unreadable process", all)
	}
	gone := &Listing{PIDs: []int{300}, PGIDs: []int32{300}, Leaders: []Leader{{PID: 300, State: Unreadable}}, watch: watch}
	if all, err := gone.WatchedAll(r); err != nil || len(all) != 0 {
		t.Errorf("WatchedAll of a process gone since = %+v, %v; want none, no error", all, err)
	}
}

// TestWatchedAllHiddenIsNoError: hidepid=1 lists other users' processes
// to a non-root caller and refuses their files: hidden, as hidepid=2
// hides them, not an error that would leave the caller's janitor unable
// to judge even its own trees.
func TestWatchedAllHiddenIsNoError(t *testing.T) {
	if os.Geteuid() == 0 {
		// Root reads every stat: the refusal is a non-root caller's. The
		// test runs again as nobody, from a copy nobody can run.
		// Not under t.TempDir, whose parent only root may enter.
		dir, err := os.MkdirTemp("", "kcpt")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "proctable.test")
		data, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestWatchedAllHiddenIsNoError$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TMPDIR=/tmp")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "PASS") {
			t.Errorf("as nobody: %v\n%s", err, out)
		}
		return
	}
	root := t.TempDir()
	stat := filepath.Join(root, "200", "stat")
	if err := os.MkdirAll(filepath.Dir(stat), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stat, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	r := NewReader(root)
	defer r.Close()
	l := &Listing{PIDs: []int{200}, PGIDs: []int32{200}, Leaders: []Leader{{PID: 200, State: Unreadable}}, watch: func([]byte) bool { return true }}
	if all, err := l.WatchedAll(r); err != nil || len(all) != 0 {
		t.Errorf("WatchedAll = %+v, %v; want none, no error", all, err)
	}
}
