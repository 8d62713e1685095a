package pgkill

import (
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

// TestSignalMemberRefusesTheWrongTarget: KillOthers signals
// members one by one, each through a pidfd after re-verifying it. A
// recorded identity whose PID now names another process, a thread ID, or
// a process outside the wrapper's groups gets nothing; the recorded
// process in its group gets the signal.
func TestSignalMemberRefusesTheWrongTarget(t *testing.T) {
	inn, err := proc.StartInnocent(&syscall.SysProcAttr{Setpgid: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inn.Close)
	st := proc.MustStat(t, fingerprint.DefaultRoot, inn.PID)

	thread := threadOf(t, inn.PID)

	recycled := st
	recycled.StartTicks++ // the recorded process was another one
	tests := []struct {
		name   string
		m      fingerprint.Stat
		groups []int
		want   int // signals the innocent catches
		// uids: the member must run wholly as one of them.
		uids []int
	}{
		{"recycled PID", recycled, []int{st.PGID}, 0, nil},
		{"thread ID", thread, []int{st.PGID}, 0, nil},
		{"outside the wrapper's groups", st, []int{os.Getpid()}, 0, nil},
		{"another user's process", st, []int{st.PGID}, 0, []int{65534, 65533}},
		// supervise's stopGroup passes [-1] when it cannot read its own
		// UIDs: no process runs as -1, so none is judged ours.
		{"no UID to signal (the wrapper's own unread)", st, []int{st.PGID}, 0, []int{-1}},
		{"the recorded member (control)", st, []int{st.PGID}, 1, []int{65534, os.Geteuid()}},
	}
	start, err := inn.Sync()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := inn.Sync()
			if err != nil {
				t.Fatal(err)
			}
			err = signalMember(fingerprint.DefaultRoot, tt.m, tt.groups, tt.uids, syscall.SIGUSR1)
			if (err == nil) != (tt.want > 0) {
				t.Errorf("signalMember = %v", err)
			}
			// The innocent's sync can overtake a signal another of its
			// threads took: wait for the one expected.
			after := caughtAtLeast(t, inn, before+tt.want)
			if got := after - before; got != tt.want {
				t.Errorf("innocent caught %d signals (%v), want %d", got, inn.Caught(), tt.want)
			}
		})
	}
	// A refused call's signal that arrived late shows here.
	if total := caughtAtLeast(t, inn, start+1); total-start != 1 {
		t.Errorf("innocent caught %d signals in all (%v), want the control's 1", total-start, inn.Caught())
	}
}

// caughtAtLeast syncs with the innocent until it has caught n signals
// (at most 5 seconds) and returns its count.
func caughtAtLeast(t *testing.T, inn *proc.Innocent, n int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := inn.Sync()
		if err != nil {
			t.Fatal(err)
		}
		if got >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSignalMemberRefusesTheCaller: the wrapper is in the group it takes
// down; signalMember must refuse it even when it is listed in its group.
// Were the signal sent, the test process would catch it below.
func TestSignalMemberRefusesTheCaller(t *testing.T) {
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGUSR2)
	defer signal.Stop(caught)
	self := proc.MustStat(t, fingerprint.DefaultRoot, os.Getpid())
	if err := signalMember(fingerprint.DefaultRoot, self, []int{self.PGID}, nil, syscall.SIGUSR2); err == nil {
		t.Error("signalMember signalled the calling process")
	}
	select {
	case <-caught:
		t.Error("the calling process caught the signal")
	case <-time.After(100 * time.Millisecond):
	}
}

// threadOf returns a thread of pid other than its main one (a Go program
// has several): its ID answers in /proc like a process's.
func threadOf(t *testing.T, pid int) fingerprint.Stat {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n != pid {
			return proc.MustStat(t, fingerprint.DefaultRoot, n)
		}
	}
	t.Fatalf("process %d has no thread besides its main one", pid)
	return fingerprint.Stat{}
}
