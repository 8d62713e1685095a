package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

func id(n int) string { return fmt.Sprintf("%064x", n) }

func TestOpenPermissions(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state") // created by Open
	s := storeWith(t, state, id(1))
	for path, want := range map[string]os.FileMode{
		state:                                 0o700,
		s.Dir():                               0o700,
		filepath.Join(s.Dir(), id(1)+".json"): 0o600,
	} {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
	}
}

func TestBadIDsNeverTouchTheDisk(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "../../etc/passwd", id(1)[:63], "X" + id(1)[1:], id(1) + "/x"} {
		t.Run(bad, func(t *testing.T) {
			called := false
			err := s.Update(bad, func(*Record) error { called = true; return nil })
			if !errors.Is(err, ErrBadID) || called {
				t.Errorf("Update(%q) = %v (fn called %v), want ErrBadID", bad, err, called)
			}
			if _, err := s.Load(bad); !errors.Is(err, ErrBadID) {
				t.Errorf("Load(%q) = %v", bad, err)
			}
		})
	}
	ents, _ := os.ReadDir(s.Dir())
	for _, e := range ents {
		if e.Name() != ".lock" {
			t.Errorf("unexpected file %s", e.Name())
		}
	}
}

func TestUpdateRoundTrip(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(id(7), func(r *Record) error {
		r.Init = &Process{PID: 42, StartTicks: 99, Comm: "sleep"}
		r.Trees = []Tree{{PGID: 5, Members: []Process{{PID: 5, StartTicks: 1}}, Source: "poststop"}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Load(id(7))
	if err != nil {
		t.Fatal(err)
	}
	if r.ContainerID != id(7) || r.Init.PID != 42 || r.BootID != s.CurrentBootID() || len(r.Trees) != 1 {
		t.Errorf("record = %+v", r)
	}
	// A failing fn leaves the record as it was.
	sentinel := errors.New("no")
	if err := s.Update(id(7), func(r *Record) error { r.Init = nil; return sentinel }); !errors.Is(err, sentinel) {
		t.Fatal(err)
	}
	if r, _ := s.Load(id(7)); r.Init == nil {
		t.Error("aborted update was written")
	}
}

func TestOtherBootRecordIsReplaced(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	old := Record{ContainerID: id(3), BootID: "another-boot", Trees: []Tree{{PGID: 9, Members: []Process{{PID: 9}}}}}
	data, _ := json.Marshal(old)
	if err := os.WriteFile(filepath.Join(s.Dir(), id(3)+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	recs, errs := s.List()
	if len(recs) != 1 || len(errs) != 0 || s.Current(recs[0]) {
		t.Fatalf("List = %v, %v; current = %v", recs, errs, s.Current(recs[0]))
	}
	if err := s.Update(id(3), func(r *Record) error {
		if len(r.Trees) != 0 {
			t.Error("update saw another boot's trees")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentUpdates runs many writers at once, as many hooks do when
// many containers stop together: no update may be lost and no record torn.
func TestConcurrentUpdates(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const writers, records = 16, 4
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each goroutine opens the lock file itself, so flock contends
			// exactly as between processes.
			for r := 0; r < records; r++ {
				err := s.Update(id(r), func(rec *Record) error {
					if rec.Stages == nil {
						rec.Stages = map[string]time.Time{}
					}
					rec.Stages[fmt.Sprintf("w%d", w)] = time.Now()
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	recs, errs := s.List()
	if len(errs) != 0 || len(recs) != records {
		t.Fatalf("List = %d records, errors %v", len(recs), errs)
	}
	for _, r := range recs {
		if len(r.Stages) != writers {
			t.Errorf("%s: %d of %d updates survived", r.ContainerID[:8], len(r.Stages), writers)
		}
	}
}

func TestListSkipsTempsAndReportsUnreadable(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(id(1), func(*Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Dir(), ".tmp-"+id(2)+"-123"), []byte("{tor"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), id(3)+".json"), []byte("{tor"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), id(4)+".json"), []byte(`{"container_id":"`+id(5)+`"}`), 0o600)
	recs, errs := s.List()
	if len(recs) != 1 || len(errs) != 2 {
		t.Errorf("List = %d records, %d errors (%v); want 1 and 2", len(recs), len(errs), errs)
	}
	if n := s.RemoveStaleTemps(0); n != 1 {
		t.Errorf("RemoveStaleTemps = %d, want 1", n)
	}
}

func TestRemove(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.Update(id(1), func(r *Record) error { r.Outcome = "keep-me"; return nil })
	if removed, err := s.Remove(id(1), func(r *Record) bool { return r.Outcome == "keep-me" }); removed || err != nil {
		t.Errorf("Remove kept = %v, %v", removed, err)
	}
	if removed, err := s.Remove(id(1), nil); !removed || err != nil {
		t.Errorf("Remove = %v, %v", removed, err)
	}
	if _, err := s.Load(id(1)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load after Remove = %v", err)
	}
	if removed, err := s.Remove(id(1), nil); removed || err != nil {
		t.Errorf("second Remove = %v, %v", removed, err)
	}
}

func TestRemoveTakesTheSupervisorLog(t *testing.T) {
	state := t.TempDir()
	s := storeWith(t, state, id(9))
	logPath := SupervisorLog(state, id(9))
	other := SupervisorLog(state, id(10))
	for _, p := range []string{logPath, other} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("log\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err := s.Remove(id(9), nil); !removed || err != nil {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Errorf("supervisor log of the removed record survived: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another container's supervisor log was removed: %v", err)
	}
}

// TestRemoveRefusesASymlinkedSupervisorsDir: a supervisors/ that someone
// replaced with a symlink (possible in a state dir others can write) must
// not lead Remove to delete a <id>.log elsewhere.
func TestRemoveRefusesASymlinkedSupervisorsDir(t *testing.T) {
	state := t.TempDir()
	s := storeWith(t, state, id(9))
	elsewhere := t.TempDir()
	victim := filepath.Join(elsewhere, id(9)+".log")
	if err := os.WriteFile(victim, []byte("not the ledger's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(state, "supervisors")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(id(9), nil); err == nil {
		t.Errorf("Remove through a symlinked supervisors/ reported no error")
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("a file outside the state dir was removed through the symlink: %v", err)
	}
	if _, err := s.Load(id(9)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the record itself should still be removed: Load = %v", err)
	}
}

func TestOpenLeavesAnExistingStateDirModeAlone(t *testing.T) {
	state := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(state); err != nil {
		t.Fatal(err)
	}
	if info, _ := os.Stat(state); info.Mode().Perm() != 0o755 {
		t.Errorf("existing state dir's mode changed to %o", info.Mode().Perm())
	}
	if info, _ := os.Stat(filepath.Join(state, "containers")); info.Mode().Perm() != 0o700 {
		t.Errorf("ledger dir mode %o, want 700", info.Mode().Perm())
	}
}

// TestLockWaitIsBounded: a lock holder that never lets go (stopped, say)
// makes Update fail with ErrLocked instead of hanging the hook.
func TestLockWaitIsBounded(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir(), ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Update(id(1), func(*Record) error { return nil })
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("Update under a held lock = %v, want ErrLocked", err)
	}
	if waited := time.Since(start); waited > LockTimeout+2*time.Second {
		t.Errorf("waited %v", waited)
	}
}

// storeWith opens the ledger in state with an empty record for each id.
func storeWith(t *testing.T, state string, ids ...string) *Store {
	t.Helper()
	s, err := Open(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range ids {
		if err := s.Update(cid, func(*Record) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestDefaultDir(t *testing.T) {
	for _, tc := range []struct {
		uid  int
		want string
	}{
		{0, "/run/kc-watchman"},
		{1001, "/run/user/1001/kc-watchman"},
		{65534, "/run/user/65534/kc-watchman"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := DefaultDir(tc.uid); got != tc.want {
				t.Fatalf("DefaultDir(%d) = %q, want %q", tc.uid, got, tc.want)
			}
		})
	}
}

func TestTraceWriteAndRead(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "missing", "a.trace"), filepath.Join(dir, "b.trace")
	e := TraceEntry{Time: time.Now().UTC(), Container: strings.Repeat("a", 64), Stage: "poststop", HostUID: 1001, StateDir: "/run/kc-watchman", Error: "mkdir /run/kc-watchman: permission denied"}
	got, err := WriteTrace([]string{first, second}, e)
	if err != nil || got != second {
		t.Fatalf("WriteTrace = %q, %v; want %q", got, err, second)
	}
	entries, from := ReadTrace([]string{first, second}, e.Time.Add(-time.Second))
	if len(entries) != 1 || entries[0].Error != e.Error || len(from) != 1 || from[0] != second {
		t.Fatalf("ReadTrace = %+v from %q", entries, from)
	}
	if entries, _ := ReadTrace([]string{second}, e.Time.Add(time.Second)); len(entries) != 0 {
		t.Fatalf("ReadTrace after the entry = %+v", entries)
	}

	t.Run("never through a symlink", func(t *testing.T) {
		target := filepath.Join(dir, "target")
		if err := os.WriteFile(target, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "link.trace")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteTrace([]string{link}, e); err == nil {
			t.Fatal("WriteTrace wrote through a symlink")
		}
		if data, _ := os.ReadFile(target); len(data) != 0 {
			t.Fatalf("the symlink's target was written: %q", data)
		}
	})
	t.Run("never another user's file", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to chown")
		}
		p := filepath.Join(dir, "theirs.trace")
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteTrace([]string{p}, e); err == nil {
			t.Fatal("WriteTrace wrote another user's file")
		}
	})
	t.Run("never a hard link to a file of ours", func(t *testing.T) {
		// Where protected_hardlinks is off, anyone may link a file of
		// ours (a binary, 0755) at a trace file's name in the temp dir.
		precious := filepath.Join(dir, "precious")
		content := strings.Repeat("x", traceLimit+1) // past the limit: would be emptied
		if err := os.WriteFile(precious, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "linked.trace")
		if err := os.Link(precious, p); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteTrace([]string{p}, e); err == nil {
			t.Fatal("WriteTrace wrote a file with another name")
		}
		if data, _ := os.ReadFile(precious); string(data) != content {
			t.Fatalf("the linked file was changed: %d bytes", len(data))
		}
	})
	t.Run("never a file others may write", func(t *testing.T) {
		p := filepath.Join(dir, "open.trace")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o622); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteTrace([]string{p}, e); err == nil {
			t.Fatal("WriteTrace wrote a file others may write")
		}
	})
	// What anyone may leave at a trace file's name in the temp dir is not
	// read: a FIFO would hold the open for ever, and another user's file,
	// or a symlink to ours, could say anything.
	t.Run("read only from a file WriteTrace would write", func(t *testing.T) {
		data, err := os.ReadFile(second)
		if err != nil {
			t.Fatal(err)
		}
		fifo := filepath.Join(dir, "fifo.trace")
		if err := unix.Mkfifo(fifo, 0o666); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "link-to-ours.trace")
		if err := os.Symlink(second, link); err != nil {
			t.Fatal(err)
		}
		open := filepath.Join(dir, "ours-others-may-write.trace")
		if err := os.WriteFile(open, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(open, 0o662); err != nil {
			t.Fatal(err)
		}
		files := []string{fifo, link, open}
		if os.Geteuid() == 0 {
			theirs := filepath.Join(dir, "theirs-with-lines.trace")
			if err := os.WriteFile(theirs, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(theirs, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			files = append(files, theirs)
		}
		var entries []TraceEntry
		testutil.NotBlockedBy(t, fifo, func() { entries, _ = ReadTrace(files, e.Time.Add(-time.Second)) })
		if len(entries) != 0 {
			t.Errorf("ReadTrace read %+v from %v", entries, files)
		}
	})
}

// TestSchemaVersions: records carry the schema they were written in; one
// without (an older hook's) reads as this one; one from a newer
// kc-watchman is refused clearly and never overwritten or removed by this
// one.
func TestSchemaVersions(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	older := strings.Repeat("a", 64)
	newer := strings.Repeat("b", 64)
	boot, err := fingerprint.BootID()
	if err != nil {
		t.Fatal(err)
	}
	write := func(id, body string) {
		t.Helper()
		if err := os.WriteFile(s.path(id), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(older, `{"container_id":"`+older+`","boot_id":"`+boot+`","outcome":"reaped"}`)
	newerBody := `{"schema":99,"container_id":"` + newer + `","boot_id":"` + boot + `","outcome":"something new"}`
	write(newer, newerBody)

	t.Run("an older hook's record reads and is rewritten in this schema", func(t *testing.T) {
		r, err := s.Load(older)
		if err != nil || r.Outcome != "reaped" {
			t.Fatalf("%+v, %v", r, err)
		}
		if err := s.Update(older, func(*Record) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Load(older); err != nil || r.Schema != Schema || r.Outcome != "reaped" {
			t.Errorf("after update: %+v, %v", r, err)
		}
	})
	t.Run("a newer record is refused, never replaced or removed", func(t *testing.T) {
		if _, err := s.Load(newer); !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "janitor first") {
			t.Errorf("load: %v", err)
		}
		if err := s.Update(newer, func(*Record) error { return nil }); !errors.Is(err, ErrNewerSchema) {
			t.Errorf("update: %v", err)
		}
		if removed, err := s.Remove(newer, nil); removed || err != nil {
			t.Errorf("remove: %v, %v", removed, err)
		}
		if data, _ := os.ReadFile(s.path(newer)); string(data) != newerBody {
			t.Errorf("the newer record changed: %s", data)
		}
		if _, errs := s.List(); len(errs) != 1 || !errors.Is(errs[0], ErrNewerSchema) {
			t.Errorf("list errors %v", errs)
		}
	})
}

// TestStripedLocks: a writer holding one record's stripe does not hold up
// a record of another stripe, and does hold up its own stripe's (within
// LockTimeout: ErrLocked).
func TestStripedLocks(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	held, other := "a"+id(1)[1:], "b"+id(1)[1:]
	f, err := os.OpenFile(filepath.Join(s.Dir(), ".lock-a"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Update(other, func(*Record) error { return nil }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a record of another stripe: %v", err)
		}
	case <-time.After(LockTimeout / 2):
		t.Fatal("a record of another stripe waited for the held one")
	}
	if err := s.Update(held, func(*Record) error { return nil }); !errors.Is(err, ErrLocked) {
		t.Errorf("a record of the held stripe: %v, want ErrLocked", err)
	}
}

// TestTraceFilesIgnoreTMPDIR: the hook runs with PATH alone and leaves its
// last-resort trace in /tmp; doctor reads the same list from a shell whose
// TMPDIR may be set, and must look there too.
func TestTraceFilesIgnoreTMPDIR(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	for _, uid := range []int{0, 1001} {
		files := TraceFiles(uid)
		if want := "/tmp/kc-hook-" + strconv.Itoa(uid) + ".trace"; files[len(files)-1] != want {
			t.Errorf("TraceFiles(%d) = %q, want the last %s", uid, files, want)
		}
	}
}

// TestTraceCutUnderItsLock: a trace over its limit is cut only by the
// writer holding its lock, the size read again there: one that cannot
// take it appends, so no hook's line is cut by another's second cut.
func TestTraceCutUnderItsLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kc-hook.trace")
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), traceLimit+1), 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	e := TraceEntry{Time: time.Now(), Stage: "poststop", StateDir: "/x", Error: "e"}
	if _, err := WriteTrace([]string{path}, e); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Size() <= traceLimit {
		t.Errorf("cut while another held the lock: %d bytes", st.Size())
	}
	held.Close()
	if _, err := WriteTrace([]string{path}, e); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Size() > traceLimit {
		t.Errorf("not cut once free: %d bytes", st.Size())
	}
}
