package pgkill

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// TestUIDsOfDoesNotTakeAFailedCheckForGone: the UIDs read of a member
// count unless the member is known to be gone or out of the group; a
// check that fails otherwise is an error, never "not in the group" (which
// would let the group's signals reach a setuid member unchecked).
func TestUIDsOfDoesNotTakeAFailedCheckForGone(t *testing.T) {
	const pid, pgid, start = fixturePID, 4240, 90000
	stat := func(pgid, start int) string { return fixtureStat(pgid, start) }
	for _, tt := range []struct {
		name     string
		stat     string
		wantErr  bool
		occupant bool // false: errNoOccupant
	}{
		{"in the group", stat(pgid, start), false, true},
		{"another process under the PID", stat(pgid, start+1), true, false},
		{"in another group now", stat(pgid+1, start), true, false},
		{"its stat unreadable", "garbled\n", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := writeSetuidFixture(t, tt.stat)
			ids, err := uidsOf(root, pgid, fingerprint.Stat{PID: pid, StartTicks: start})
			if (err != nil) != tt.wantErr || errors.Is(err, errNoOccupant) == tt.occupant {
				t.Errorf("uidsOf = %v, %v; want error %v, not-in-the-group %v", ids, err, tt.wantErr, !tt.occupant)
			}
			if err == nil && ids != [3]int{1000, 0, 0} {
				t.Errorf("uids %v, want the setuid member's [1000 0 0]", ids)
			}
		})
	}
}

// fixturePID is the setuid member of the fake /proc these tests write.
const fixturePID = 4242

// fixtureStat is fixturePID's stat line in group pgid, started at start.
func fixtureStat(pgid, start int) string {
	// 52 fields: pgrp is the 5th, num_threads the 20th, starttime the 22nd.
	f := make([]string, 50)
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[2], f[17], f[19] = "S", "1", strconv.Itoa(pgid), "1", strconv.Itoa(start)
	return fmt.Sprintf("%d (sleep) %s\n", fixturePID, strings.Join(f, " "))
}

// writeSetuidFixture writes a /proc holding fixturePID with stat and a
// status of a setuid program (real UID 1000, effective and saved 0).
func writeSetuidFixture(t *testing.T, stat string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(fixturePID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("Name:\tsleep\nTgid:\t%d\nPid:\t%d\nUid:\t1000\t0\t0\t0\n", fixturePID, fixturePID)
	for name, data := range map[string]string{"stat": stat, "status": status} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestOwnedNeedsTheTreesUID: with CheckUID, a member is the tree's only
// if its real, effective and saved UIDs are all the tree's. A setuid
// member (1000, 0, 0) is no tree's of UID 1000, nor of root's, nor of a
// tree whose UID is unknown (-1, what SoleUID says of it).
func TestOwnedNeedsTheTreesUID(t *testing.T) {
	const pgid, start = 4240, 90000
	root := writeSetuidFixture(t, fixtureStat(pgid, start))
	for _, uid := range []int{1000, 0, -1} {
		t.Run(strconv.Itoa(uid), func(t *testing.T) {
			k := &killer{opt: Options{Root: root, UID: uid, CheckUID: true}, pgid: pgid}
			if err := k.owned([]fingerprint.Stat{{PID: fixturePID, StartTicks: start}}); !errors.Is(err, errOtherUID) {
				t.Errorf("owned = %v, want %v", err, errOtherUID)
			}
		})
	}
}
