package podman

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if err := caller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	caller.Wait()
	// A zombie counts as dead: it is PID 1's to reap now.
	proc.WaitFor(t, 10*time.Second, fmt.Sprintf("child %d to die with its SIGKILLed caller", child), func() bool { return proc.Dead(child) })
}
