package contain

import (
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// TestStillJudged: cgroup.kill is written only while the cgroup holds
// exactly the processes judged, each still the one judged: a PID that
// now names another process (recycled: another start), a process moved
// in, or one gone since sends the sweep to each judged process's pidfd.
func TestStillJudged(t *testing.T) {
	a, b := testutil.StartSleep(t, nil, "1000000"), testutil.StartSleep(t, nil, "1000000")
	for _, tc := range []struct {
		name   string
		now    []int
		judged map[int]uint64
		want   bool
	}{
		{"as judged", []int{a.PID, b.PID}, map[int]uint64{a.PID: a.StartTicks, b.PID: b.StartTicks}, true},
		{"a PID recycled since", []int{a.PID, b.PID}, map[int]uint64{a.PID: a.StartTicks, b.PID: b.StartTicks + 1}, false},
		{"one moved in", []int{a.PID, b.PID}, map[int]uint64{a.PID: a.StartTicks}, false},
		{"one judged is gone", []int{a.PID}, map[int]uint64{a.PID: a.StartTicks, b.PID: b.StartTicks}, false},
		{"another in its place", []int{a.PID, b.PID}, map[int]uint64{a.PID: a.StartTicks, b.PID + 1<<22: b.StartTicks}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stillJudged("/proc", tc.now, tc.judged); got != tc.want {
				t.Errorf("stillJudged = %v, want %v", got, tc.want)
			}
		})
	}
}
