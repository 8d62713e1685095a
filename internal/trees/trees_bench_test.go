package trees

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// The benchmarks scan the host's /proc as it is, plus three fake
// supervisor trees. bench/cmd/kcbench fills the host with up to 30k
// processes and compares the same scans with ps and the seed's approach
// (docs/PERFORMANCE.md).

func startBenchTrees(b *testing.B) {
	for range 3 {
		testutil.StartKCServer(b, b.TempDir(), testutil.Fake{ContainerID: cidLive, Children: 2})
	}
}

func BenchmarkScan(b *testing.B) {
	startBenchTrees(b)
	for _, v := range []struct {
		name string
		opt  Options
	}{
		{"fast-bpf", Options{Lister: proctable.ListBPF}},
		{"fast-proc", Options{Lister: proctable.ListProc}},
		{"full", Options{Full: true}},
	} {
		b.Run(v.name, func(b *testing.B) {
			var st Stats
			opt := v.opt
			opt.Comms = []string{"kcserver"}
			for b.Loop() {
				var err error
				if _, st, err = Scan(opt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(st.Processes), "procs/op")
			b.ReportMetric(float64(st.StatReads), "stat-reads/op")
			b.ReportMetric(float64(st.FullReads), "full-reads/op")
		})
	}
	b.Run("naive", func(b *testing.B) {
		for b.Loop() {
			naiveScan(b)
		}
	})
}

// naiveScan is the scan without the optimisations, for comparison: stat
// and cmdline of every process through os.ReadFile.
func naiveScan(b *testing.B) int {
	pids, err := proctable.PIDs("/proc")
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, pid := range pids {
		st, err := fingerprint.ReadStat("/proc", pid)
		if err != nil {
			continue
		}
		argv, err := fingerprint.ReadArgv("/proc", pid)
		if err != nil {
			continue
		}
		if len(containerid.FromArgv(argv)) > 0 && st.PGID > 0 {
			n++
		}
	}
	return n
}

// BenchmarkRead compares the fast scan's reader with package fingerprint's
// on this process.
func BenchmarkRead(b *testing.B) {
	pid := os.Getpid()
	b.Run("stat/fingerprint", func(b *testing.B) {
		for b.Loop() {
			if _, err := fingerprint.ReadStat("/proc", pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stat/proctable", func(b *testing.B) {
		r := proctable.NewReader("/proc")
		defer r.Close()
		for b.Loop() {
			if _, err := r.Stat(pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("identity/fingerprint", func(b *testing.B) {
		for b.Loop() {
			if _, err := fingerprint.Read("/proc", pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("identity/proctable", func(b *testing.B) {
		r := proctable.NewReader("/proc")
		defer r.Close()
		for b.Loop() {
			if _, err := r.Identity(pid); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// errClass is how the scan tells read errors apart.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fingerprint.ErrNotFound):
		return "not-found"
	case errors.Is(err, fingerprint.ErrNotProcess):
		return "not-process"
	case errors.Is(err, fingerprint.ErrMalformed):
		return "malformed"
	}
	return "other"
}

// TestProcReaderMatchesFingerprint checks that the fast scan's reader
// returns what package fingerprint returns, value and error class, on every
// process of the host, on thread IDs and on malformed fixtures: the fast
// and the full scan then decide on the same data.
func TestProcReaderMatchesFingerprint(t *testing.T) {
	k := testutil.StartKCServer(t, t.TempDir(), testutil.Fake{ContainerID: cidLive, Children: 2})
	r := proctable.NewReader("/proc")
	defer r.Close()

	pids, err := proctable.PIDs("/proc")
	if err != nil {
		t.Fatal(err)
	}
	// Thread IDs of this (multi-threaded) test process answer in /proc
	// too, without being listed.
	if tasks, err := os.ReadDir("/proc/self/task"); err == nil {
		for _, e := range tasks {
			if tid, err := strconv.Atoi(e.Name()); err == nil && tid != os.Getpid() {
				pids = append(pids, tid)
			}
		}
	}
	pids = append(pids, 1<<22+1) // never a PID
	compared, threads := 0, 0
	for _, pid := range pids {
		// A process may change between two reads; compare twice before
		// calling it a difference, and skip processes that vanish.
		var ok bool
		var fa, fb fingerprint.Identity
		var ea, eb error
		for try := 0; try < 3 && !ok; try++ {
			fa, ea = fingerprint.Read("/proc", pid)
			fb, eb = r.Identity(pid)
			ok = errClass(ea) == errClass(eb) && (ea != nil || reflect.DeepEqual(stable(fa), stable(fb)))
		}
		if !ok && (errClass(ea) == "not-found" || errClass(eb) == "not-found") {
			continue
		}
		if !ok {
			t.Errorf("pid %d: identity differs:\nfingerprint %+v (%v)\nproctable   %+v (%v)", pid, fa, ea, fb, eb)
			continue
		}
		if errClass(ea) == "not-process" {
			threads++
		}
		sa, ea := fingerprint.ReadStat("/proc", pid)
		sb, eb := r.Stat(pid)
		if errClass(ea) != errClass(eb) || (ea == nil && sa.PID != sb.PID) {
			t.Errorf("pid %d: stat differs: %+v (%v) vs %+v (%v)", pid, sa, ea, sb, eb)
		}
		compared++
	}
	if compared < 5 || threads == 0 {
		t.Fatalf("compared %d processes and %d thread IDs; expected more", compared, threads)
	}
	id, err := r.Identity(k.PGID)
	if err != nil || containerid.FromArgv(id.Argv)[0] != cidLive || id.Comm != WrapperComm {
		t.Errorf("fake supervisor's wrapper %d: %+v, %v", k.PGID, id, err)
	}
	if id, err := r.Identity(k.PID); err != nil || id.Comm != "kcserver" {
		t.Errorf("fake supervisor %d: %+v, %v", k.PID, id, err)
	}

	// Fixtures: the error paths a live host rarely shows.
	root := writeFixture(t, []proc{
		{pid: 100, pgid: 100, comm: "kcserver", start: 90000, argv: []string{"kcserver", cidA}},
		{pid: 101, pgid: 100, comm: "sleep", start: 90000, tgid: 100},
		{pid: 102, pgid: 100, comm: "a) (b", state: 'Z', start: 90000},
		{pid: 103, pgid: 100, comm: "nouid", start: 90000},
		{pid: 104, pgid: 100, comm: "badstat", start: 90000},
		{pid: 105, pgid: 100, comm: "otherpid", start: 90000},
	})
	write := func(pid int, file, data string) {
		if err := os.WriteFile(filepath.Join(root, strconv.Itoa(pid), file), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(103, "status", "Name:\tnouid\nTgid:\t103\n")
	write(104, "stat", "104 (badstat) S 1 x\n")
	write(105, "stat", "999 (otherpid) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 90000 0 0 0\n")
	// A long argv, beyond the reader's first buffer.
	long := make([]string, 2000)
	for i := range long {
		long[i] = "argument-" + strconv.Itoa(i)
	}
	write(100, "cmdline", joinArgv(append([]string{"kcserver", cidA}, long...)))

	fr := proctable.NewReader(root)
	defer fr.Close()
	for _, pid := range []int{100, 101, 102, 103, 104, 105, 106} {
		fa, ea := fingerprint.Read(root, pid)
		fb, eb := fr.Identity(pid)
		if errClass(ea) != errClass(eb) || (ea == nil && !reflect.DeepEqual(fa, fb)) {
			t.Errorf("fixture pid %d: identity differs:\nfingerprint %+v (%v)\nproctable   %+v (%v)", pid, fa, ea, fb, eb)
		}
		sa, ea := fingerprint.ReadStat(root, pid)
		sb, eb := fr.Stat(pid)
		if errClass(ea) != errClass(eb) || (ea == nil && sa != sb) {
			t.Errorf("fixture pid %d: stat differs: %+v (%v) vs %+v (%v)", pid, sa, ea, sb, eb)
		}
	}
	if id, err := fr.Identity(100); err != nil || len(id.Argv) != 2002 {
		t.Errorf("long argv: %d elements, %v", len(id.Argv), err)
	}
}

// stable drops what changes between two reads of a running process.
func stable(id fingerprint.Identity) fingerprint.Identity {
	id.State, id.Threads = 0, 0
	// A workqueue's kworker renames itself as it starts and finishes work
	// ("kworker/1:1H+kblockd", then "-kblockd"), often enough under I/O
	// that three paired reads can all straddle a rename.
	if id.PID == 2 || id.PPID == 2 {
		id.Comm = ""
	}
	return id
}

func joinArgv(argv []string) string {
	s := ""
	for _, a := range argv {
		s += a + "\x00"
	}
	return s
}
