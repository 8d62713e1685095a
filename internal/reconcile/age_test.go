package reconcile

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestFreshChildrenDoNotKeepAStrayYoung: a gone container's tree whose
// supervisor keeps starting short-lived children (a kernel's polling
// loop) is as old as its supervisor, and reaped once that is past
// --min-age; fresh members that name the container keep it young (a
// tree in the making).
func TestFreshChildrenDoNotKeepAStrayYoung(t *testing.T) {
	const comm = "kcsrv-age"
	sh := filepath.Join(t.TempDir(), comm)
	if err := testutil.CopyFile("/bin/sh", sh, 0o755); err != nil {
		t.Fatal(err)
	}
	const minAge = time.Second
	for _, tc := range []struct {
		name string
		// loop always has a child younger than minAge running.
		loop string
		want action.Action
	}{
		{"children naming no container", `while :; do sleep 0.6 & sleep 0.3; done`, action.WouldReap},
		// "; :" keeps a shell that execs its last command (bash) from
		// dropping the ID.
		{"children naming the container", `while :; do sh -c 'sleep 0.6; :' "$0" & sleep 0.3; done`, action.SkipYoung},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone := testutil.RandomHex(t, 64)
			cmd := proc.StartGroup(t, exec.Command(sh, "-c", tc.loop, gone))
			leader := proc.MustStat(t, fingerprint.DefaultRoot, cmd.Process.Pid)
			if err := proc.WaitTickPast(fingerprint.DefaultRoot, leader.StartTicks+uint64(2*minAge/(time.Second/100)), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			proc.WaitFor(t, 5*time.Second, "the loop's children", func() bool { return len(proc.GroupMembers(leader.PID)) >= 3 })
			live := engine.Set{Source: engine.SourceAPI, Live: map[string]bool{}, UID: os.Geteuid()}
			var tr *Tree
			// A child caught between fork and exec still carries the
			// leader's argv, and dates the tree: a few looks.
			for range 3 {
				rep, err := Run(context.Background(), Options{Comms: []string{comm}, Containers: map[string]bool{gone: true}, MinAge: minAge}, live)
				if err != nil {
					t.Fatal(err)
				}
				if tr = findByPGID(rep, leader.PID); tr == nil || tr.Action == tc.want {
					break
				}
			}
			if tr == nil || tr.Action != tc.want {
				t.Fatalf("the tree: %+v, want %s", tr, tc.want)
			}
			if len(tr.Members) < 2 {
				t.Fatalf("the scan saw none of the loop's children: %+v", tr.Members)
			}
		})
	}
}
