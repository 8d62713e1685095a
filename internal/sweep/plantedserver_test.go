package sweep

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// plantedVerdicts is what the copy in the PID namespace saw.
type plantedVerdicts struct {
	PID                    int
	Planted, Session       Verdict
	PlantedWhy, SessionWhy string
}

// TestSessionSocketNotJudgedByAnotherUsersServer: a session socket
// follows its server's control socket in the same directory, but only
// its own user's. Another user plants kc-<pid>.sock in /tmp for a PID a
// supervisor later gets: that socket is stale (older than the process),
// and must not make the supervisor's own session socket, found not
// listening between its bind and its listen, stale with it.
func TestSessionSocketNotJudgedByAnotherUsersServer(t *testing.T) {
	if proc.InPIDNamespace() {
		plantedServer(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a PID namespace and chown")
	}
	var got plantedVerdicts
	proc.RunInPIDNamespace(t, "TestSessionSocketNotJudgedByAnotherUsersServer", time.Minute, &got)
	if got.Planted != VerdictStale {
		t.Errorf("the planted control socket: %s (%s), want stale (the setup did not work)", got.Planted, got.PlantedWhy)
	}
	if got.Session == VerdictStale {
		t.Errorf("the live supervisor's session socket: stale (%s) on another user's planted control socket", got.SessionWhy)
	}
}

func plantedServer(t *testing.T) {
	proc.EnterPIDNamespace(t)
	testutil.BuildKCServer(t) // built now: its PIDs are not the supervisor's
	dir := shortTemp(t)
	const pid = 4000
	planted := orphanSocket(t, dir, fmt.Sprintf("kc-%d.sock", pid))
	if err := os.Lchown(planted, testutil.Nobody, testutil.Nobody); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(planted, &st); err != nil {
		t.Fatal(err)
	}
	// Older than the supervisor by more than the owner gate's slack.
	made := time.Unix(st.Ctim.Unix())
	proc.WaitFor(t, 10*time.Second, "the planted socket to age", func() bool { return time.Since(made) > startSlack+100*time.Millisecond })
	if err := proc.SetNextPID("/proc", pid); err != nil {
		t.Fatal(err)
	}
	k := testutil.StartKCServer(t, shortTemp(t), testutil.Fake{})
	if k.PID != pid {
		t.Fatalf("the supervisor got pid %d, not %d", k.PID, pid)
	}
	// Its session socket, bound but not (yet) listening.
	session := orphanSocket(t, dir, fmt.Sprintf("kc-%d.deadbeef.sock", pid))
	got := sweep(t, fastConfig(dir))
	v := plantedVerdicts{PID: k.PID}
	if s := got[planted]; s != nil {
		v.Planted, v.PlantedWhy = s.Verdict, s.Reason
	}
	if s := got[session]; s != nil {
		v.Session, v.SessionWhy = s.Verdict, s.Reason
	}
	proc.WriteSummary(t, v)
}
