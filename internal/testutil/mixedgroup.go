package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// MixedGroup is a process group whose leader carries one container's ID
// and a member another's: ambiguous, though the leader alone does not
// show it.
type MixedGroup struct {
	PGID int
	// Member is the process carrying the other ID.
	Member int
}

// StartMixedGroup starts a shell named comm (a copy of /bin/sh, so that
// comm puts it in a supervisor set) that leads its own group with
// leaderID in its argv, and in that group a shell with memberID in its
// argv and its sleep. It returns once all three run; the group is killed
// at cleanup.
func StartMixedGroup(t testing.TB, comm, leaderID, memberID string) MixedGroup {
	t.Helper()
	sh := filepath.Join(t.TempDir(), comm)
	if err := CopyFile("/bin/sh", sh, 0o755); err != nil {
		t.Fatal(err)
	}
	// memberID comes through the environment, which is no anchor, to stay
	// out of the leader's argv. The member's script has two commands, so
	// that sh does not exec its sleep and take the ID out of the group.
	cmd := exec.Command(sh, "-c", `sh -c 'sleep 100000; :' "$KC_MIXED_MEMBER" & echo $!; wait`, leaderID)
	cmd.Env = append(os.Environ(), "KC_MIXED_MEMBER="+memberID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := MixedGroup{PGID: cmd.Process.Pid}
	t.Cleanup(func() {
		syscall.Kill(-g.PGID, syscall.SIGKILL)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("mixed group: reading the member's PID: %v", err)
	}
	if g.Member, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
		t.Fatalf("mixed group: member PID %q: %v", line, err)
	}
	children := "/proc/" + strconv.Itoa(g.Member) + "/task/" + strconv.Itoa(g.Member) + "/children"
	for deadline := time.Now().Add(10 * time.Second); ; {
		if data, err := os.ReadFile(children); err == nil && len(strings.TrimSpace(string(data))) > 0 {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("mixed group: the member's sleep did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
