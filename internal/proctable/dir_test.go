package proctable

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
)

func TestParsePID(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int
		ok   bool
	}{
		{"pid", "1234", 1234, true},
		{"one", "1", 1, true},
		{"self is no pid", "self", 0, false},
		{"empty", "", 0, false},
		{"sign", "+12", 0, false},
		{"too long for any pid", "1234567890123456789", 0, false},
		{"trailing letter", "12a", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParsePID([]byte(tt.in))
			if got != tt.want || ok != tt.ok {
				t.Errorf("ParsePID(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestListMatchesReaddir: the getdents64 listing with a buffer of any size
// names the numeric entries os.ReadDir sees. Other tests' processes come
// and go meanwhile, so it is held against a listing before and one after:
// a process in both must be in it, and it may name only processes in
// either (one born and gone within the pass is why a pass is taken
// again).
func TestListMatchesReaddir(t *testing.T) {
	readdir := func() map[int]bool {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		pids := map[int]bool{}
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				pids[pid] = true
			}
		}
		return pids
	}
	for _, size := range []int{64, 512, 64 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			for try := 0; ; try++ {
				before := readdir()
				l, err := openDir("/proc", size)
				if err != nil {
					t.Fatal(err)
				}
				var got []int
				for {
					var done bool
					if got, done, err = l.Next(got); err != nil {
						t.Fatal(err)
					}
					if done {
						break
					}
				}
				l.Close()
				after := readdir()
				listed := map[int]bool{}
				var extra, missing []int
				for _, pid := range got {
					listed[pid] = true
					if !before[pid] && !after[pid] {
						extra = append(extra, pid)
					}
				}
				for pid := range before {
					if after[pid] && !listed[pid] {
						missing = append(missing, pid)
					}
				}
				if len(extra) == 0 && len(missing) == 0 && len(got) == len(listed) {
					return
				}
				if try == 9 {
					t.Fatalf("listing with a %d-byte buffer: %d PIDs (%d distinct), missing %v, extra %v", size, len(got), len(listed), missing, extra)
				}
			}
		})
	}
}

// TestInGroup: every member of a real process group is found, and nothing
// outside it.
func TestInGroup(t *testing.T) {
	var cmds []*exec.Cmd
	pgid := 0
	for range 3 {
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if pgid == 0 {
			pgid = cmd.Process.Pid
		}
		cmds = append(cmds, cmd)
	}
	outsider := exec.Command("sleep", "1000")
	if err := outsider.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outsider.Process.Kill(); outsider.Wait() })

	got, err := InGroup(pgid)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range cmds {
		if !slices.Contains(got, cmd.Process.Pid) {
			t.Errorf("member %d missing from InGroup(%d) = %v", cmd.Process.Pid, pgid, got)
		}
	}
	if slices.Contains(got, outsider.Process.Pid) || slices.Contains(got, os.Getpid()) {
		t.Errorf("InGroup(%d) = %v holds a process outside the group", pgid, got)
	}
	if len(got) != len(cmds) {
		t.Errorf("InGroup(%d) = %v, want the %d members", pgid, got, len(cmds))
	}
}
