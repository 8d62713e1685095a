package taskiter

import (
	"os"
	"slices"
	"strconv"
	"testing"
)

func TestParseLoadavg(t *testing.T) {
	for _, tt := range []struct {
		in    string
		tasks int
		ok    bool
	}{
		{"0.20 0.18 0.12 1/80 11206\n", 80, true},
		{"1.00 2.00 3.00 12/10420 15600", 10420, true},
		{"0.20 0.18 0.12 1/80\n", 0, false},
		{"0.20 0.18 0.12 80 11206\n", 0, false},
		{"0.20 0.18 0.12 1/x 11206\n", 0, false},
		{"0.20 0.18 0.12 1/0 5\n", 0, false},
		{"", 0, false},
	} {
		tasks, err := parseLoadavg([]byte(tt.in))
		if (err == nil) != tt.ok || tasks != tt.tasks {
			t.Errorf("parseLoadavg(%q) = %d, %v; want %d (ok %v)", tt.in, tasks, err, tt.tasks, tt.ok)
		}
	}
}

func TestParseForks(t *testing.T) {
	for _, tt := range []struct {
		in    string
		forks uint64
		ok    bool
	}{
		{"cpu  1 2 3\nintr 5 6\nctxt 7\nbtime 8\nprocesses 1565661\nprocs_running 1\n", 1565661, true},
		{"processes 42", 42, true},
		{"cpu 1\nprocs_running 1\n", 0, false},
		{"xprocesses 42\n", 0, false},
		{"processes x\n", 0, false},
		{"", 0, false},
	} {
		forks, err := parseForks([]byte(tt.in))
		if (err == nil) != tt.ok || forks != tt.forks {
			t.Errorf("parseForks(%q) = %d, %v; want %d (ok %v)", tt.in, forks, err, tt.forks, tt.ok)
		}
	}
}

func TestCensusUnlisted(t *testing.T) {
	quiet := Census{TasksBefore: 100, TasksAfter: 100, ForksBefore: 7, ForksAfter: 7}
	for _, tt := range []struct {
		name   string
		c      Census
		listed int
		n      int
		exact  bool
	}{
		{"quiet, every process listed", quiet, 100, 0, true},
		{"quiet, processes holding three tasks unlisted", quiet, 97, 3, true},
		// A task created during the pass may stand in for one unlisted,
		// whatever the last PID says: it may have been handed out before.
		{"a task created", Census{TasksBefore: 100, TasksAfter: 100, ForksBefore: 7, ForksAfter: 8}, 100, 0, false},
		// A task gone may have offset one unlisted.
		{"a task went away", Census{TasksBefore: 100, TasksAfter: 99, ForksBefore: 7, ForksAfter: 7}, 99, 0, false},
		{"more listed than there were", quiet, 101, 0, false},
	} {
		n, exact := tt.c.Unlisted(tt.listed)
		if n != tt.n || exact != tt.exact {
			t.Errorf("%s: Unlisted(%d) = %d, %v; want %d, %v", tt.name, tt.listed, n, exact, tt.n, tt.exact)
		}
	}
}

// TestEachCensus: when a pass can vouch for its count, the tasks it says
// unlisted processes hold are exactly the tasks of the processes /proc
// lists and the pass did not (on this project's VMs, PID 1's; elsewhere,
// none).
func TestEachCensus(t *testing.T) {
	for try := 0; try < 50; try++ {
		var listed []int
		tasks := 0
		census, err := Each(func(task *Task) {
			listed = append(listed, task.PID)
			tasks += task.Threads
		})
		if err != nil {
			if Unsupported(err) {
				t.Skipf("task iterator not usable on this host: %v", err)
			}
			t.Fatal(err)
		}
		n, exact := census.Unlisted(tasks)
		if !exact {
			continue // something started or ended meanwhile: try again
		}
		unlisted := 0
		for pid := range procPIDs(t) {
			if _, ok := slices.BinarySearch(listed, pid); ok {
				continue
			}
			entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
			if err != nil {
				continue // gone since
			}
			unlisted += len(entries)
		}
		tasks, forks := census.TasksAfter, census.ForksAfter
		if err := census.Recheck(); err != nil || census.TasksAfter != tasks || census.ForksAfter != forks {
			continue // the host changed while we looked
		}
		if n != unlisted {
			t.Fatalf("census %+v says unlisted processes hold %d tasks; /proc shows %d in processes the pass did not list", census, n, unlisted)
		}
		return
	}
	t.Skip("no quiet moment in 50 passes: every one saw a task start or end")
}
