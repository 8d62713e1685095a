package pgkill

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestUnverifiableMembersAreNotGone: when the members' /proc entries cannot
// be read (here: a procfs view whose stat is garbage), Kill must neither
// signal nor report the group gone — callers would then unlink the live
// tree's sockets and call it reaped.
func TestUnverifiableMembersAreNotGone(t *testing.T) {
	st := testutil.StartSleep(t, &syscall.SysProcAttr{Setpgid: true}, "1000")
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(st.PID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"stat", "status"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := Kill(context.Background(), Group{PGID: st.PGID, Members: []fingerprint.Stat{st}}, Options{Root: root, Grace: 100 * time.Millisecond, KillWait: 200 * time.Millisecond})
	if res.Outcome != action.WouldNotDie || res.Err == nil || len(res.Signals) != 0 {
		t.Errorf("Kill = %+v, want would-not-die with an error and no signal", res)
	}
	if !fingerprint.Alive("/proc", st) {
		t.Error("the unverifiable process was signalled")
	}
}
