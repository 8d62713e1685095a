//go:build reliability

package reliability

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

const sweepComm = "kcrel-sweep"

// planted is one file the attack put in place, and what the rules say
// may happen to it.
type planted struct {
	path      string
	what      string
	mayUnlink bool   // a stale socket the rules allow to be unlinked
	ino       uint64 // inode when planted (0: check only that it exists)
}

// deadPIDs returns n PIDs of processes that have exited and been reaped.
func deadPIDs(t testing.TB, n int) []int {
	t.Helper()
	var out []int
	for range n {
		c := exec.Command("true")
		if err := c.Run(); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Process.Pid)
	}
	return out
}

func inode(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestSweepUnderAttack plants everything a hostile user (or an unlucky
// host) can put where kc-janitor sweep --apply looks — symlinks to
// sockets and files elsewhere, regular files, FIFOs, directories, other
// users' sockets, names that only look like supervisor sockets, a
// directory matched by a glob that is a symlink elsewhere — and swaps
// sockets for something else between classification and unlink (held
// there by a tripwire socket). Only what the rules allow may disappear:
// stale sockets of the directory's owner (any owner in a sticky
// world-writable directory). A live supervisor's socket next to them
// stays.
func TestSweepUnderAttack(t *testing.T) {
	const rounds = 4
	var (
		plantedN, swapped, unlinked, allowed, violations int
		kinds                                            = map[string]int{}
	)
	for round := 0; round < rounds; round++ {
		base := shortDir(t, "kcrel-sw-")
		mk := func(name string, mode os.FileMode, uid int) string {
			d := filepath.Join(base, name)
			if err := os.Mkdir(d, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(d, mode); err != nil { // past the umask, keeping the sticky bit
				t.Fatal(err)
			}
			if err := os.Chown(d, uid, uid); err != nil {
				t.Fatal(err)
			}
			return d
		}
		private := mk("priv", 0o755, 0)             // like /run/user/0
		sticky := mk("tmp", 0o777|os.ModeSticky, 0) // like /tmp
		userDir := mk("user", 0o700, nobody)        // like /run/user/65534
		outside := mk("outside", 0o700, 0)          // never swept
		globParent := mk("glob", 0o755, 0)          // swept as glob/*
		if err := os.Mkdir(filepath.Join(globParent, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(globParent, "evil")); err != nil {
			t.Fatal(err)
		}
		dead := deadPIDs(t, 40)
		next := 0
		name := func() string { next++; return "kc-" + strconv.Itoa(dead[next-1]) + ".sock" }

		var files []*planted
		plant := func(p, what string, mayUnlink bool) *planted {
			f := &planted{path: p, what: what, mayUnlink: mayUnlink, ino: inode(t, p)}
			files = append(files, f)
			kinds[what]++
			return f
		}
		socketAs := func(dir, n string, uid int) string {
			p := orphanSocket(t, dir, n)
			if err := os.Chown(p, uid, uid); err != nil {
				t.Fatal(err)
			}
			return p
		}

		// Outside: things an attacker would like removed.
		outSock := plant(orphanSocket(t, outside, name()), "socket outside the swept dirs", false)
		outFile := filepath.Join(outside, "precious")
		if err := os.WriteFile(outFile, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		plant(outFile, "file outside the swept dirs", false)

		for _, d := range []string{private, sticky} {
			n := name()
			if err := os.Symlink(outSock.path, filepath.Join(d, n)); err != nil {
				t.Fatal(err)
			}
			plant(filepath.Join(d, n), "symlink to a stale socket elsewhere", false)
			n = name()
			if err := os.Symlink(outFile, filepath.Join(d, n)); err != nil {
				t.Fatal(err)
			}
			plant(filepath.Join(d, n), "symlink to a file", false)
			n = name()
			if err := os.WriteFile(filepath.Join(d, n), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			plant(filepath.Join(d, n), "regular file", false)
			n = name()
			if err := unix.Mkfifo(filepath.Join(d, n), 0o600); err != nil {
				t.Fatal(err)
			}
			plant(filepath.Join(d, n), "FIFO", false)
			n = name()
			if err := os.Mkdir(filepath.Join(d, n), 0o700); err != nil {
				t.Fatal(err)
			}
			orphanSocket(t, filepath.Join(d, n), "kc-1.sock")
			plant(filepath.Join(d, n), "directory named like a socket", false)
			// Names that only look like supervisor sockets, each an
			// orphan socket: never even considered.
			for _, bad := range []string{"kc-..sock", "kc-.sock", "kc-0.sock", "kc-01.sock", "kc--1.sock", "kc-1 .sock",
				"kc-12.sock.bak", "kc-12..sock", "kc-12.a.b.sock", "kc-12.SOCK", "kc-\uff19.sock", "kc-99999999.sock",
				"kc-4194305.sock", "kc-12.a%2F..sock", "kc-12.\u2215etc.sock", "kc-..%2F..%2Fetc.sock", "KC-12.sock", "kc-12.sock\n"} {
				plant(orphanSocket(t, d, bad), "look-alike name", false)
			}
			// A directory named kc-.. holding ../etc.sock-style paths.
			dd := filepath.Join(d, "kc-..")
			if err := os.Mkdir(dd, 0o755); err != nil {
				t.Fatal(err)
			}
			plant(orphanSocket(t, dd, "etc.sock"), "socket under a kc-.. directory", false)
			// The genuine article: a stale socket of the directory's owner.
			plant(orphanSocket(t, d, name()), "stale socket (control)", true)
			plant(orphanSocket(t, d, "kc-"+strconv.Itoa(dead[next-1])+".abc123.sock"), "stale socket (session)", true)
		}
		// Other users' sockets: kept in a directory they do not own,
		// fair game in a sticky world-writable one.
		plant(socketAs(private, name(), nobody), "another user's socket in root's dir", false)
		plant(socketAs(sticky, name(), nobody), "another user's stale socket in a sticky dir", true)
		plant(socketAs(userDir, name(), 0), "root's socket in a user's dir", false)
		plant(socketAs(userDir, name(), nobody), "the user's own stale socket in its dir", true)
		// A glob match that is a symlink to a directory elsewhere.
		plant(orphanSocket(t, filepath.Join(globParent, "a"), name()), "stale socket in a glob-matched dir", true)
		plant(orphanSocket(t, outside, name()), "stale socket behind a glob-matched symlink", false)

		// A live supervisor: kept.
		k := testutil.StartKCServer(t, private, testutil.Fake{Comm: sweepComm, OpenChannels: true})
		plant(k.Socket, "live supervisor's socket", false)

		// Swaps between classification and unlink, held by a tripwire:
		// a socket whose GET /status waits until the swaps are done.
		type swap struct {
			victim string
			kind   string
			do     func(p string) error
		}
		swaps := []swap{
			{kind: "swapped for a new socket", do: func(p string) error {
				os.Remove(p)
				socketAs(filepath.Dir(p), filepath.Base(p), 0)
				return nil
			}},
			{kind: "swapped for a symlink to a socket elsewhere", do: func(p string) error {
				tmp := p + ".tmp"
				if err := os.Symlink(outSock.path, tmp); err != nil {
					return err
				}
				return os.Rename(tmp, p)
			}},
			{kind: "swapped for a regular file", do: func(p string) error {
				tmp := p + ".tmp"
				if err := os.WriteFile(tmp, []byte("x"), 0o600); err != nil {
					return err
				}
				return os.Rename(tmp, p)
			}},
			{kind: "swapped for another user's socket", do: func(p string) error {
				os.Remove(p)
				socketAs(filepath.Dir(p), filepath.Base(p), nobody)
				return nil
			}},
			{kind: "swapped for a live listener", do: func(p string) error {
				os.Remove(p)
				l, err := net.Listen("unix", p)
				if err != nil {
					return err
				}
				l.(*net.UnixListener).SetUnlinkOnClose(false)
				testutil.Serve(t, l)
				return nil
			}},
		}
		for i := range swaps {
			d := private
			if i%2 == 1 {
				d = sticky
			}
			swaps[i].victim = orphanSocket(t, d, name())
		}
		var swapErr error
		var once sync.Once
		tripwire := filepath.Join(private, name())
		l, err := net.Listen("unix", tripwire)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			once.Do(func() {
				for _, s := range swaps {
					if err := s.do(s.victim); err != nil && swapErr == nil {
						swapErr = err
					}
				}
			})
			// Then stay silent: no answer, connection closed.
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
				}
			}
		}))
		plant(tripwire, "tripwire (ours, listening)", false)

		// The sweep.
		r := runTool(t, janitorBin(t), baseEnv("/usr/bin:/bin"), "", "sweep", "--apply", "--format", "json",
			"--supervisor-comm", sweepComm, "--timeout", "5s",
			"--socket-dir", private, "--socket-dir", sticky, "--socket-dir", userDir, "--socket-dir", globParent+"/*")
		var rep sweepJSON
		decodeJSON(t, r, &rep)
		if swapErr != nil {
			t.Fatal(swapErr)
		}
		if r.Code != 0 {
			t.Errorf("round %d: sweep exit %d: %s", round, r.Code, r.Stderr)
		}
		unlinkedPaths := map[string]bool{}
		for _, s := range rep.Sockets {
			if s.Action == "unlinked" {
				unlinkedPaths[s.Path] = true
				unlinked++
			}
		}

		// The verdict of the file system.
		for _, f := range files {
			_, err := os.Lstat(f.path)
			gone := os.IsNotExist(err)
			switch {
			case gone && f.mayUnlink:
				allowed++
			case gone:
				violations++
				t.Errorf("round %d: %s %s was unlinked", round, f.what, f.path)
			case f.mayUnlink:
				t.Errorf("round %d: %s %s was kept: %+v", round, f.what, f.path, findSocket(rep, f.path))
			case inode(t, f.path) != f.ino:
				violations++
				t.Errorf("round %d: %s %s was replaced", round, f.what, f.path)
			}
		}
		plantedN += len(files)
		for _, s := range swaps {
			swapped++
			kinds[s.kind]++
			if _, err := os.Lstat(s.victim); err != nil {
				violations++
				t.Errorf("round %d: %s: the swapped-in file at %s was unlinked (%v): %+v", round, s.kind, s.victim, err, findSocket(rep, s.victim))
			}
		}
		if _, err := os.Lstat(outSock.path); err != nil {
			violations++
			t.Errorf("round %d: the outside socket went: %v", round, err)
		}
		k.Kill(t)
	}

	const area = "sweep-attack"
	report(t, area, "rounds", rounds)
	report(t, area, "files_planted", plantedN)
	report(t, area, "swaps_between_classification_and_unlink", swapped)
	report(t, area, "planted_by_kind", kinds)
	report(t, area, "unlinked_as_the_rules_allow", allowed)
	report(t, area, "unlinked_outside_the_rules", violations)
	if violations != 0 {
		t.Errorf("%d files outside the rules were unlinked or replaced", violations)
	}
}

func findSocket(rep sweepJSON, path string) string {
	for _, s := range rep.Sockets {
		if s.Path == path {
			return fmt.Sprintf("%s/%s: %s", s.Verdict, s.Action, s.Reason)
		}
	}
	return "not reported"
}
