package podman

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestCommandChildDiesWithCaller: a CLI child (watch keeps `podman events`
// running for its whole life) is killed when its caller dies without
// cleaning up (SIGKILL, a crash), instead of living on under PID 1.
func TestCommandChildDiesWithCaller(t *testing.T) {
	if os.Getenv("KC_TEST_PDEATHSIG_CALLER") == "1" {
		// The caller: start a long child through Command, say its PID, wait
		// to be killed.
		cmd, err := Command(context.Background(), "sleep", []string{"1000"})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		select {}
	}
	caller := exec.Command(os.Args[0], "-test.run=^TestCommandChildDiesWithCaller$")
	caller.Env = append(os.Environ(), "KC_TEST_PDEATHSIG_CALLER=1")
	out, err := caller.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	child, convErr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || convErr != nil {
		caller.Process.Kill()
		t.Fatalf("caller said %q (%v)", line, err)
	}
	// Cleaned up through a pidfd opened now, while the caller holds the
	// child unreaped: by cleanup time the PID may be another's.
	pidfd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		caller.Process.Kill()
		t.Fatalf("pidfd of the child %d: %v", child, err)
	}
	if st, err := fingerprint.ReadStat("/proc", child); err != nil || st.PPID != caller.Process.Pid {
		unix.Close(pidfd)
		caller.Process.Kill()
		t.Fatalf("pid %d is not the caller's child: %+v, %v", child, st, err)
	}
	t.Cleanup(func() {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Close(pidfd)
	})
	if err := caller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	caller.Wait()
	// A zombie counts as dead: it is PID 1's to reap now.
	proc.WaitFor(t, 10*time.Second, fmt.Sprintf("child %d to die with its SIGKILLed caller", child), func() bool { return proc.Dead(child) })
}
