//go:build reliability

package reliability

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil/podman"
)

const stateComm = "kcrel-state"

// brokenStateDir mounts a small tmpfs and breaks it: "read-only" (remounted
// read-only, with a ledger directory already in it) or "full" (every block
// used). It returns the state dir path; the mount goes when t ends.
func brokenStateDir(t testing.TB, how string) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	state := filepath.Join(mnt, "state")
	if err := os.MkdirAll(filepath.Join(state, "containers"), 0o700); err != nil {
		t.Fatal(err)
	}
	switch how {
	case "read-only":
		if err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount read-only: %v", err)
		}
	case "full":
		f, err := os.Create(filepath.Join(mnt, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
		f.Close()
	}
	return state
}

// removeNewTrace removes, when t ends, the trace file a hook on a broken
// state dir leaves at path (the root hook's trace has no override), unless
// it was there before t: then it is the host's, and stays.
func removeNewTrace(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err == nil {
		t.Logf("%s exists already: the lines this test adds stay in it", path)
		return
	}
	t.Cleanup(func() { os.Remove(path) })
}

// TestBrokenStateDir: with the state dir read-only or full, kc-hook still
// exits as DESIGN "The outside" says — createRuntime 0 (a hook never stops a
// container from starting), poststop 0 once the trees are reaped (the
// ledger is bookkeeping) — and reaps the trees; a real container with the
// hook installed still starts and stops.
func TestBrokenStateDir(t *testing.T) {
	e := podmantest.New(t)
	removeNewTrace(t, ledger.RootStateDir+".trace")
	runs, okExits, reaped, trees := 0, 0, 0, 0
	for _, how := range []string{"read-only", "full"} {
		state := brokenStateDir(t, how)
		env := baseEnv("/usr/bin:/bin", "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+stateComm, "KC_KILL_GRACE=200ms")

		// The hook by hand: every stage, with and without a tree.
		cid := newCID(t)
		for _, stage := range []string{"createRuntime", "createContainer", "startContainer", "poststart"} {
			r := runTool(t, hookBin(t), env, `{"id":"`+cid+`","status":"creating","pid":`+strconv.Itoa(os.Getpid())+`}`, stage)
			runs++
			if r.Code == 0 {
				okExits++
			} else {
				t.Errorf("%s: %s exit %d, want 0: %s", how, stage, r.Code, r.Stderr)
			}
		}
		for _, withTree := range []bool{false, true} {
			var ms []fingerprint.Stat
			if withTree {
				sup := startSupervisor(t, stateComm, cid, &syscall.SysProcAttr{Setpgid: true})
				ms = []fingerprint.Stat{sup.Stat, startKernel(t, inGroup(sup.PID)).Stat}
				trees++
			}
			r := runTool(t, hookBin(t), env, hookState(cid), "poststop")
			runs++
			if r.Code == 0 {
				okExits++
			} else {
				t.Errorf("%s: poststop (tree: %v) exit %d, want 0: %s", how, withTree, r.Code, r.Stderr)
			}
			if withTree {
				if waitAllDead(ms, 5*time.Second) {
					reaped++
				} else {
					t.Errorf("%s: poststop left the tree alive", how)
				}
			}
		}

		// A real container, hook installed, on the broken state dir.
		for _, d := range []string{"kc-hook-createruntime.json", "kc-hook-poststop.json"} {
			os.Remove(filepath.Join(e.HooksDir(), d))
		}
		installHook(t, e, "KC_STATE_DIR="+state, "KC_SUPERVISOR_COMM="+stateComm, "KC_KILL_GRACE=200ms")
		id := e.Run(t)
		runs++
		if st := e.State(t, id); st != "running" {
			t.Fatalf("%s: container is %s after run", how, st)
		}
		sup := startSupervisor(t, stateComm, id, &syscall.SysProcAttr{Setpgid: true})
		ms := []fingerprint.Stat{sup.Stat, startKernel(t, inGroup(sup.PID)).Stat}
		trees++
		e.Stop(t, id)
		runs++
		if st := e.State(t, id); st != "exited" && st != "stopped" {
			t.Errorf("%s: container is %s after stop", how, st)
		}
		if waitAllDead(ms, 5*time.Second) {
			reaped++
		} else {
			t.Errorf("%s: the container's tree survived its stop", how)
		}
		if out, err := e.Podman("rm", "-f", id); err != nil {
			t.Errorf("%s: rm: %v %s", how, err, strings.TrimSpace(out))
		}
	}

	const area = "state-dir"
	report(t, area, "conditions", "read-only, full")
	report(t, area, "hook_and_container_runs", runs)
	report(t, area, "hook_runs_exiting_0", okExits)
	report(t, area, "trees_reaped", strconv.Itoa(reaped)+"/"+strconv.Itoa(trees))
}
