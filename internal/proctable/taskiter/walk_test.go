package taskiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/proc"
)

func TestParseWalkHeader(t *testing.T) {
	hdr := func(end, full, first uint32) []byte {
		b := make([]byte, walkHeaderSize)
		binary.NativeEndian.PutUint32(b[0:], end)
		binary.NativeEndian.PutUint32(b[4:], full)
		binary.NativeEndian.PutUint32(b[8:], first)
		return b
	}
	tests := []struct {
		name        string
		hdr         []byte
		first, end  int
		full        bool
		errContains string
	}{
		{"records from 0", hdr(300, 0, 0), 0, 300, false, ""},
		{"records from a later index", hdr(300, 0, 7), 7, 300, false, ""},
		{"none", hdr(0, 0, 0), 0, 0, false, ""},
		{"as many as the map holds", hdr(1000, 0, 0), 0, 1000, false, ""},
		{"full", hdr(1000, 1, 0), 0, 0, true, ""},
		{"more than the map holds", hdr(1001, 0, 0), 0, 0, false, "map of 1000"},
		{"end before first", hdr(3, 0, 5), 0, 0, false, "[5, 3)"},
		{"nothing written: the program never ran", nil, 0, 0, false, "wrote 0 bytes"},
		{"two headers: the program ran twice", append(hdr(1, 0, 0), hdr(1, 0, 0)[:4]...), 0, 0, false, "wrote 16 bytes"},
		{"a short header", hdr(1, 0, 0)[:8], 0, 0, false, "wrote 8 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, end, full, err := parseWalkHeader(tt.hdr, 1000)
			if tt.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errContains) {
					t.Fatalf("error %v, want one containing %q", err, tt.errContains)
				}
				return
			}
			if err != nil || first != tt.first || end != tt.end || full != tt.full {
				t.Fatalf("got [%d, %d) full %v err %v, want [%d, %d) full %v", first, end, full, err, tt.first, tt.end, tt.full)
			}
		})
	}
}

func TestWalkProgram(t *testing.T) {
	l := progLayout
	l.rdonlyCast, l.taskStruct = 65425, 114
	l.walkNew, l.walkNext, l.walkDestroy = 64198, 64201, 64193
	const mapFD = 42
	prog, err := walkProgram(l, mapFD)
	if err != nil {
		t.Fatal(err)
	}
	kfuncs := map[int32]int{}
	var nextAt, castAt []int
	for at, in := range prog {
		if in.op == opCall && in.src == pseudoKfuncCall {
			kfuncs[in.imm]++
			switch uint32(in.imm) {
			case l.walkNext:
				nextAt = append(nextAt, at)
			case l.rdonlyCast:
				castAt = append(castAt, at)
			}
		}
	}
	if kfuncs[int32(l.walkNew)] != 1 || kfuncs[int32(l.walkNext)] != 1 || kfuncs[int32(l.walkDestroy)] != 1 || kfuncs[int32(l.rdonlyCast)] != 1 {
		t.Fatalf("kfunc calls %v: want new, next, destroy and the cast once each", kfuncs)
	}
	// Every backward jump returns to the call of next: the verifier
	// proves the loop ends through the iterator, and only there.
	backs := 0
	for at, in := range prog {
		if in.op != opJa && in.op != opJneReg && in.op != opJeqImm || in.off >= 0 {
			continue
		}
		backs++
		if to := at + 1 + int(in.off); to+2 != nextAt[0] || prog[to] != mov(r1, r10) {
			t.Errorf("jump back at %d lands on %d; the call of next is at %d", at, to, nextAt[0])
		}
	}
	if backs != 2 {
		t.Errorf("%d jumps back, want 2 (a thread skipped, a record written)", backs)
	}
	// The task is read only through the cast's untrusted pointer.
	for at, in := range prog {
		if (in.op == opLdxW || in.op == opLdxDW) && in.src == r7 && at < castAt[0] {
			t.Errorf("load through r7 at %d, before the cast at %d", at, castAt[0])
		}
	}
	// The map is named once, by a two-instruction load of its fd.
	maps := 0
	for at, in := range prog {
		if in.op == opLdImm64 {
			maps++
			if in.src != pseudoMapFD || in.imm != mapFD || at+1 >= len(prog) || prog[at+1] != (insn{}) {
				t.Errorf("map load at %d: %+v %+v", at, in, prog[min(at+1, len(prog)-1)])
			}
		}
	}
	if maps != 1 {
		t.Errorf("%d map loads, want 1", maps)
	}
	if n := len(prog); prog[n-1] != exit() || prog[n-2] != movImm(r0, 0) {
		t.Errorf("program does not end with r0 = 0; exit")
	}
	for _, missing := range []func(*layout){
		func(l *layout) { l.walkNew = 0 },
		func(l *layout) { l.rdonlyCast = 0 },
	} {
		bad := l
		missing(&bad)
		if _, err := walkProgram(bad, mapFD); err == nil {
			t.Errorf("walk built for a layout without its kfuncs: %+v", bad)
		}
	}
}

// kernelWalk returns the kernel's layout, skipping where the walk cannot
// run here.
func kernelWalk(t *testing.T) layout {
	t.Helper()
	if err := checkNamespaces(); err != nil {
		t.Skip(err)
	}
	l, err := readLayout()
	if err != nil {
		t.Skipf("no usable kernel BTF: %v", err)
	}
	if l.walkNew == 0 || l.rdonlyCast == 0 {
		t.Skip("kernel without the open-coded task iterator")
	}
	return l
}

// TestWalkReadsTheSame: the walk lists what the task iterator program
// does, field by field, and Load chooses it where the kernel has it.
func TestWalkReadsTheSame(t *testing.T) {
	l := kernelWalk(t)
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.w == nil {
		t.Fatal("Load did not choose the walk on a kernel that has it")
	}
	fd, err := loadFor(l)
	if err != nil {
		t.Fatal(err)
	}
	iter := &Program{fd: fd}
	defer iter.Close()
	start, err := proc.UptimeTicks(root)
	if err != nil {
		t.Fatal(err)
	}
	walked, iterated := sameSteady(t, "walked", "iterated", func() (map[int]Task, map[int]Task) {
		return byPID(t, p), byPID(t, iter)
	})
	if _, ok := walked[0]; ok {
		t.Error("the walk listed PID 0, the idle task")
	}
	// A process one pass left out must have come or gone meanwhile: one
	// that started before both and still runs was left out wrongly.
	for _, pair := range [][2]map[int]Task{{iterated, walked}, {walked, iterated}} {
		for pid, task := range pair[0] {
			if _, ok := pair[1][pid]; ok || task.StartTicks >= start {
				continue
			}
			if st, err := fingerprint.ReadStat(root, pid); err == nil && st.StartTicks == task.StartTicks {
				t.Errorf("PID %d (%s), running since before both passes, is in one only", pid, task.Comm())
			}
		}
	}
}

// TestWalkGrows: a host with more processes than the walk's map holds
// gets a map for them all, and the pass lists them.
func TestWalkGrows(t *testing.T) {
	l := kernelWalk(t)
	w := &walker{l: l, fd: -1}
	if err := w.load(8); err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if _, _, full, err := runWalk(w.fd, w.m); err != nil || !full {
		t.Fatalf("a walk into a map of 8: full %v, err %v; want full", full, err)
	}
	var pids []int
	if _, err := w.each(func(task *Task) { pids = append(pids, task.PID) }); err != nil {
		t.Fatal(err)
	}
	if w.m.cap <= 8 || len(pids) > w.m.cap {
		t.Errorf("map of %d records after a pass of %d processes", w.m.cap, len(pids))
	}
	if !slices.IsSorted(pids) || !slices.Contains(pids, os.Getpid()) {
		t.Errorf("pass of %d processes: sorted %v, this process in it %v", len(pids), slices.IsSorted(pids), slices.Contains(pids, os.Getpid()))
	}
	w.close()
	if _, err := w.each(func(*Task) {}); err == nil {
		t.Error("a pass of a closed walk succeeded")
	}
}

// TestWalkRecords: the walk's records come out by PID, from the header's
// first index on, without the idle task's; a PID listed twice (reused
// while the walk ran) is reported, and would be refused by the lister.
func TestWalkRecords(t *testing.T) {
	rec := func(pid uint32) []byte {
		b := make([]byte, recordSize)
		binary.NativeEndian.PutUint32(b, pid)
		binary.NativeEndian.PutUint32(b[12:], 1) // a thread
		return b
	}
	var data []byte
	for _, pid := range []uint32{999, 0, 7, 300, 5, 42, 300} {
		data = append(data, rec(pid)...)
	}
	pids := func(recs [][]byte) []uint32 {
		var out []uint32
		for _, r := range recs {
			out = append(out, binary.NativeEndian.Uint32(r))
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		first, end int
		want       []uint32
		wantTwice  int
	}{
		{"from the header's first index", 1, 6, []uint32{5, 7, 42, 300}, 0},
		{"none", 3, 3, nil, 0},
		{"a PID reused", 0, 7, []uint32{5, 7, 42, 300, 300, 999}, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, twice := walkRecords(data, tc.first, tc.end)
			if got := pids(recs); !slices.Equal(got, tc.want) || twice != tc.wantTwice {
				t.Errorf("records [%d, %d): %v, twice %d; want %v, %d", tc.first, tc.end, got, twice, tc.want, tc.wantTwice)
			}
			if tc.wantTwice == 0 {
				return
			}
			ls := newLister(func(*Task) {})
			for _, r := range recs {
				ls.record(r)
			}
			if ls.order == nil || !errors.Is(ls.order, ErrUnavailable) || !strings.Contains(ls.order.Error(), "PID 300 after 300") {
				t.Errorf("a PID listed twice reaching the lister: %v, want the pass refused", ls.order)
			}
		})
	}
}

// TestJudgeCache: a pass that failed for churn keeps the layout file;
// one that failed otherwise (the listing disagreed with /proc) removes
// it, so that the next load reads the kernel's BTF again.
func TestJudgeCache(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		kept bool
	}{
		{"pass succeeded", nil, true},
		{"PIDs reused in every walk", fmt.Errorf("%w: %w: PID 7 was listed twice", ErrUnavailable, ErrChurn), true},
		{"listing disagrees with /proc", fmt.Errorf("%w: the listing disagrees with /proc for this process", ErrUnavailable), false},
		{"iterator out of order", fmt.Errorf("%w: the iterator listed PID 3 after 3", ErrUnavailable), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "layout")
			if err := os.WriteFile(file, []byte("layout"), 0o600); err != nil {
				t.Fatal(err)
			}
			p := &Program{fd: -1, cache: file}
			p.judgeCache(tc.err)
			_, err := os.Stat(file)
			if kept := err == nil; kept != tc.kept {
				t.Errorf("after %v: layout file kept %v, want %v", tc.err, kept, tc.kept)
			}
		})
	}
}

// TestForkedSince: a PID seen twice, or a map overflowing, is churn only
// if the host forked meanwhile; otherwise it is the walk's mistake, which
// must not pass for churn (churn keeps the layout file).
func TestForkedSince(t *testing.T) {
	count := func(n uint64, err error) func() (uint64, error) {
		return func() (uint64, error) { return n, err }
	}
	for _, tc := range []struct {
		name     string
		count    func() (uint64, error)
		wantErr  bool
		misreads bool
	}{
		{"forked meanwhile", count(1001, nil), false, false},
		{"nothing forked", count(1000, nil), true, true},
		{"fork count unreadable", count(0, errors.New("task census: no processes line in /proc/stat")), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := forkedSince(tc.count, 1000, "PID 7 was listed twice")
			if (err != nil) != tc.wantErr || errors.Is(err, ErrChurn) || (err != nil && !errors.Is(err, ErrUnavailable)) {
				t.Fatalf("forkedSince = %v; want error %v, never churn, always ErrUnavailable", err, tc.wantErr)
			}
			if got := err != nil && strings.Contains(err.Error(), "misreads this kernel"); got != tc.misreads {
				t.Errorf("forkedSince = %v; want it to say the walk misreads the kernel: %v", err, tc.misreads)
			}
		})
	}
}
