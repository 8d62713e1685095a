package fingerprint_test

import (
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// listPIDs reads the process IDs listed in /proc (threads are not listed).
func listPIDs(b *testing.B) []int {
	b.Helper()
	f, err := os.Open(root)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		b.Fatal(err)
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// benchAll measures one scan of the machine: list /proc, then read every
// process. It reports the cost per process read.
func benchAll(b *testing.B, read func(pid int) error) {
	var procs, vanished int
	b.ReportAllocs()
	for b.Loop() {
		for _, pid := range listPIDs(b) {
			err := read(pid)
			if err == nil {
				procs++
			} else if errors.Is(err, fingerprint.ErrNotFound) {
				vanished++ // exited between the listing and the read
			} else {
				b.Fatalf("pid %d: %v", pid, err)
			}
		}
	}
	if procs == 0 {
		b.Fatal("read no process")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(procs), "ns/proc")
	b.ReportMetric(float64(procs)/float64(b.N), "procs/op")
	b.ReportMetric(float64(vanished)/float64(b.N), "vanished/op")
}

func BenchmarkReadStatAll(b *testing.B) {
	benchAll(b, func(pid int) error {
		_, err := fingerprint.ReadStat(root, pid)
		return err
	})
}

func BenchmarkReadAll(b *testing.B) {
	benchAll(b, func(pid int) error {
		_, err := fingerprint.Read(root, pid)
		return err
	})
}

func BenchmarkParseStat(b *testing.B) {
	line := []byte(statLine("26232 (a) (b)", "S", "26231 26231 26231", "1", "1001"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fingerprint.ParseStat(line); err != nil {
			b.Fatal(err)
		}
	}
}
