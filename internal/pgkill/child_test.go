package pgkill_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/pgkill"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// RunOwnGroup kills what the child left in its group, whether the child
// exited or overstayed, the child itself wherever it went, and nothing
// else that left the group (a setsid'd process is another group: not its
// to kill).
func TestRunOwnGroup(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		argv         []string // run instead of the script, with the PID file's path last
		timedOut     bool
		survives     bool // the child's child must outlive the run
	}{
		{name: "exits leaving a child", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; exit 0"},
		{name: "overstays", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; wait", timedOut: true},
		// The child itself leaves its group for a bystander's, then writes
		// its PID: the group killed is then empty, and the child must die
		// all the same, by PID; the group it joined must not.
		{name: "leaves its group", argv: []string{"perl", "-e", `setpgrp(0, $ENV{KC_BYSTANDER_PGID}) or die "setpgrp: $!"; open(my $f, ">", $ARGV[0]) or die; print $f "$$"; close $f; sleep 600`}, timedOut: true},
		// The child writes its PID once setsid has moved it out of the group.
		{name: "a child in its own session", script: "setsid sh -c 'echo $$ >\"$1\"; exec sleep 600' sh \"$1\" </dev/null >/dev/null 2>&1 & while [ ! -s \"$1\" ]; do :; done; exit 0", survives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "child")
			cmd := exec.Command("/bin/sh", "-c", tc.script, "sh", pidFile)
			if tc.argv != nil {
				if _, err := exec.LookPath(tc.argv[0]); err != nil {
					t.Skipf("no %s here: %v", tc.argv[0], err)
				}
				cmd = exec.Command(tc.argv[0], append(tc.argv[1:], pidFile)...)
				// A group of its own to join (never the test's): a kill of
				// the group the child is in now would take it down.
				bystander := exec.Command("sleep", "600")
				bystander.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := bystander.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })
				cmd.Env = append(os.Environ(), "KC_BYSTANDER_PGID="+strconv.Itoa(bystander.Process.Pid))
				defer func() {
					if !fingerprint.Running(fingerprint.DefaultRoot, bystander.Process.Pid) {
						t.Error("the group the child joined was killed")
					}
				}()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The child is pinned as soon as it has written its PID, alive
			// then: cleaned up through that pidfd, never by a PID that may
			// be another process's once it was killed and reaped. For a
			// deadline, it comes once the child has done what the case is
			// about, however slow the machine.
			pinned := pinWhenWritten(ctx, pidFile, func() {
				if tc.timedOut {
					cancel()
				}
			})
			defer killPinned(cancel, pinned)
			var timedOut bool
			var err error
			ran := make(chan struct{})
			go func() {
				defer close(ran)
				timedOut, err = pgkill.RunOwnGroup(ctx, cmd)
			}()
			select {
			case <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("RunOwnGroup did not return within 10 s") // the deferred pidfd kills the child
			}
			if timedOut != tc.timedOut {
				t.Errorf("timedOut = %v (err %v), want %v", timedOut, err, tc.timedOut)
			}
			pid := testutil.ReadPID(t, pidFile)
			if tc.survives {
				if !fingerprint.Running(fingerprint.DefaultRoot, pid) {
					t.Errorf("the child %d in its own session was killed", pid)
				}
				return
			}
			if !testutil.WaitStopped(pid, 5*time.Second) {
				t.Fatalf("the child %d outlived the run", pid)
			}
		})
	}
}

// pinWhenWritten opens a pidfd for the PID the child writes to pidFile as
// soon as it is there (the child alive then, and one of ours: its comm is
// sleep's, perl's, or sh's before it execs sleep), calls then, and sends the pidfd (-1: none) once.
// Opened later, once the child was killed and reaped, it could pin
// whatever took the PID.
func pinWhenWritten(ctx context.Context, pidFile string, then func()) <-chan int {
	pinned := make(chan int, 1)
	go func() {
		// A last look once ctx ends: the test may be over before the
		// first tick, with a survivor to clean up.
		for done := false; !done; time.Sleep(5 * time.Millisecond) {
			done = ctx.Err() != nil
			if data, err := os.ReadFile(pidFile); err == nil && len(data) > 0 {
				fd := -1
				pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
				if f, err := unix.PidfdOpen(pid, 0); err == nil {
					if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid); err == nil && (st.Comm == "sleep" || st.Comm == "perl" || st.Comm == "sh") {
						fd = f
					} else {
						unix.Close(f)
					}
				}
				pinned <- fd
				then()
				return
			}
		}
		pinned <- -1
	}()
	return pinned
}

// killPinned ends the wait of pinWhenWritten (cancel) and kills what it
// pinned.
func killPinned(cancel func(), pinned <-chan int) {
	cancel()
	if fd := <-pinned; fd >= 0 {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	}
}

// OwnGroupKilledOnCancel kills the child's group when the context ends
// while the child runs, and never once the child has exited by itself:
// what it left in its group then stays (podman's rootless pause process).
func TestOwnGroupKilledOnCancel(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		survives     bool // the child's child must outlive the run and the cancel
	}{
		{name: "overstays", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; wait"},
		{name: "exits leaving a child", script: "sleep 600 </dev/null >/dev/null 2>&1 & echo $! >\"$1\"; exit 0", survives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "child")
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			pctx, pcancel := context.WithCancel(context.Background())
			defer killPinned(pcancel, pinWhenWritten(pctx, pidFile, func() {}))
			cmd := exec.CommandContext(ctx, "/bin/sh", "-c", tc.script, "sh", pidFile)
			pgkill.OwnGroupKilledOnCancel(cmd)
			err := cmd.Run()
			cancel() // the context ends after the child, where it exited first
			pid := testutil.ReadPID(t, pidFile)
			if tc.survives {
				if err != nil {
					t.Fatalf("the child failed: %v", err)
				}
				// A kill would have come within Run: Cancel runs only then.
				if !fingerprint.Running(fingerprint.DefaultRoot, pid) {
					t.Errorf("the child %d it left in its group was killed after it exited", pid)
				}
				return
			}
			if !testutil.WaitStopped(pid, 5*time.Second) {
				t.Fatalf("the child %d outlived the deadline (run: %v)", pid, err)
			}
		})
	}
}
