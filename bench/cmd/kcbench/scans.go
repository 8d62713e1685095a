package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// pair is a (process group, container) decision: "this group is that
// container's supervisor tree and may be signalled".
type pair struct {
	PGID        int    `json:"pgid"`
	ContainerID string `json:"container_id"`
}

func sortPairs(ps []pair) []pair {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].PGID != ps[j].PGID {
			return ps[i].PGID < ps[j].PGID
		}
		return ps[i].ContainerID < ps[j].ContainerID
	})
	return ps
}

// timing is a wall time and the CPU time (user + system) spent meanwhile.
type timing struct {
	Wall time.Duration `json:"wall_ns"`
	CPU  time.Duration `json:"cpu_ns"`
}

// selfCPU is this process's CPU time so far, all threads. The harness does
// nothing else while it times an in-process scan.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rusageCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// projectScan runs the project's scan in this process (lister matters
// only to the fast scan).
func projectScan(full bool, lister proctable.Lister, comms []string, known map[trees.Key]string) ([]trees.Tree, trees.Stats, timing, error) {
	c0, start := selfCPU(), time.Now()
	ts, st, err := trees.Scan(trees.Options{Comms: comms, Known: known, Full: full, Lister: lister})
	return ts, st, timing{time.Since(start), selfCPU() - c0}, err
}

// decision is what the fast-vs-full comparison looks at for a signalable
// tree: everything the reaper acts on.
type decision struct {
	PGID      int
	Container string
	ByLedger  bool
	UID       int
	Members   []string // pid:start
}

func signalable(ts []trees.Tree) []decision {
	var out []decision
	for _, t := range ts {
		if !t.Signalable() {
			continue
		}
		d := decision{PGID: t.PGID, Container: t.ContainerID, ByLedger: t.ByLedger, UID: t.UID}
		for _, m := range t.Members {
			d.Members = append(d.Members, fmt.Sprintf("%d:%d", m.PID, m.StartTicks))
		}
		slices.Sort(d.Members)
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PGID < out[j].PGID })
	return out
}

func pairsOf(ds []decision) []pair {
	out := make([]pair, len(ds))
	for i, d := range ds {
		out[i] = pair{d.PGID, d.Container}
	}
	return out
}

// naiveScan is the straightforward Go scan: read /proc/<pid>/stat and
// /proc/<pid>/cmdline for every process, group by PGID, then decide (a
// group with a supervisor-comm member and exactly one container ID, not
// led by a live process outside the supervisor set).
func naiveScan(comms map[string]bool) ([]pair, int, timing, error) {
	c0, start := selfCPU(), time.Now()
	f, err := os.Open("/proc")
	if err != nil {
		return nil, 0, timing{}, err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, 0, timing{}, err
	}
	type member struct {
		st  fingerprint.Stat
		ids []string
	}
	groups := map[int][]member{}
	n := 0
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		n++
		data, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		st, err := fingerprint.ParseStat(data)
		if err != nil || st.Zombie() || st.PGID <= 0 || st.PID != pid {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + name + "/cmdline")
		if err != nil {
			continue
		}
		groups[st.PGID] = append(groups[st.PGID], member{st, containerid.FromArgv(fingerprint.SplitArgv(cmd))})
	}
	var out []pair
	for pgid, ms := range groups {
		sup, foreign := false, false
		var ids []string
		for _, m := range ms {
			if comms[m.st.Comm] {
				sup = true
			}
			if m.st.PID == pgid && !comms[m.st.Comm] {
				foreign = true
			}
			for _, id := range m.ids {
				if !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
		}
		if sup && !foreign && len(ids) == 1 {
			out = append(out, pair{pgid, ids[0]})
		}
	}
	return sortPairs(out), n, timing{time.Since(start), selfCPU() - c0}, nil
}

// lineCounter counts newlines written to it.
type lineCounter struct{ n int }

func (l *lineCounter) Write(p []byte) (int, error) {
	l.n += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

// runPS runs `ps -e -o pid=,pgid=,lstart=,args=` and returns its wall time
// and the number of lines it printed.
func runPS() (timing, int, error) {
	var lc lineCounter
	cmd := exec.Command("ps", "-e", "-o", "pid=,pgid=,lstart=,args=")
	cmd.Stdout = &lc
	start := time.Now()
	err := cmd.Run()
	return timing{time.Since(start), rusageCPU(cmd.ProcessState)}, lc.n, err
}

// seedResult is what bench/seed_janitor.py prints.
type seedResult struct {
	Processes      int     `json:"processes"`
	Matches        int     `json:"matches"`
	Groups         int     `json:"groups"`
	ScanSeconds    float64 `json:"scan_seconds"`
	ScanCPUSeconds float64 `json:"scan_cpu_seconds"`
	Trees          [][]any `json:"trees"`
	Whole          timing  `json:"-"` // the process, start-up included
}

// runSeed runs the seed-approach script and returns its own scan time
// (inside the interpreter) and its wall time (with Python's start-up).
func runSeed(python, script string) (seedResult, error) {
	var out, stderr bytes.Buffer
	cmd := exec.Command(python, script)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	var r seedResult
	if err != nil {
		return r, fmt.Errorf("%s: %v: %s", script, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("%s: %v", script, err)
	}
	r.Whole = timing{wall, rusageCPU(cmd.ProcessState)}
	return r, nil
}

func (r seedResult) scan() timing {
	return timing{time.Duration(r.ScanSeconds * float64(time.Second)), time.Duration(r.ScanCPUSeconds * float64(time.Second))}
}

// seedPairs returns the (pgid, container) pairs the seed script reported.
func (r seedResult) pairs() map[pair]bool {
	out := map[pair]bool{}
	for _, t := range r.Trees {
		if len(t) != 2 {
			continue
		}
		pg, ok1 := t[0].(float64)
		id, ok2 := t[1].(string)
		if ok1 && ok2 {
			out[pair{int(pg), id}] = true
		}
	}
	return out
}

// groupMembers lists the live members of process group pgid: getpgid(2)
// on every process, stat only for the members.
func groupMembers(pgid int) []fingerprint.Stat {
	f, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	var out []fingerprint.Stat
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if g, err := unix.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		if err == nil && st.PGID == pgid && !st.Zombie() {
			out = append(out, st)
		}
	}
	return out
}

// pythonExecutable resolves python3 to the interpreter itself (pyenv and
// similar put a shell-script shim first in PATH, whose start-up would be
// timed too).
func pythonExecutable(python string) (string, string, error) {
	if python == "" {
		python = "python3"
	}
	out, err := exec.Command(python, "-c", "import sys; print(sys.executable); print(sys.version.split()[0])").Output()
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", python, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 2 {
		return "", "", fmt.Errorf("%s: unexpected output %q", python, out)
	}
	return lines[0], lines[1], nil
}
