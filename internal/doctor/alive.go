package doctor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// BootTime reads the boot time from <procRoot>/stat (btime).
func BootTime(procRoot string) (time.Time, error) {
	data, err := os.ReadFile(procRoot + "/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("btime %q: %w", v, err)
			}
			return time.Unix(n, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime in " + procRoot + "/stat")
}

// AliveInput is what HookAlive looks at.
type AliveInput struct {
	// StateDir and LogFile are where the hook writes (see HookStateDir).
	StateDir, LogFile string
	Boot              time.Time
	// LiveContainers is how many containers podman lists as live; -1
	// when podman could not be asked.
	LiveContainers int
	// NoPodman: podman is not an engine asked here, so LiveContainers
	// says nothing, and what is said of the hook names no podman.
	NoPodman bool
	Now      time.Time
	// HostUID is the host UID the hook runs as for this janitor (its
	// own): log lines a hook of another UID wrote to a shared log file
	// are not this user's hook's runs. Lines of hooks that did not say
	// their UID count for anyone.
	HostUID int
	// TraceFiles are where a hook that could not keep its books left a
	// line (ledger.TraceFiles).
	TraceFiles []string
}

// hookRun is the latest evidence of a hook run.
type hookRun struct {
	stage string
	at    time.Time
}

// logTail is how much of the end of the hook's log is read.
const logTail = 1 << 20

// readHookLog counts the hook's log lines written since boot and returns
// the latest one.
func readHookLog(path string, boot time.Time, hostUID int) (int, hookRun, error) {
	// Not blocking on a FIFO at the log's name, nor reading one.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return 0, hookRun{}, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && !st.Mode().IsRegular() {
		return 0, hookRun{}, fmt.Errorf("%s: not a regular file", path)
	} else if err == nil && st.Size() > logTail {
		if _, err := f.Seek(-logTail, io.SeekEnd); err != nil {
			return 0, hookRun{}, err
		}
	}
	n := 0
	var last hookRun
	// Only the tail: a log written to meanwhile is not followed.
	sc := bufio.NewScanner(io.LimitReader(f, logTail))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		var rec struct {
			Time    time.Time `json:"time"`
			Stage   string    `json:"stage"`
			HostUID *int      `json:"host_uid"`
		}
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &rec) != nil || rec.Stage == "" {
			continue // a line cut by the seek, or not the hook's
		}
		if rec.HostUID != nil && *rec.HostUID != hostUID {
			continue // another user's hook sharing the log file
		}
		if rec.Time.Before(boot) {
			continue
		}
		n++
		if rec.Time.After(last.at) {
			last = hookRun{rec.Stage, rec.Time}
		}
	}
	return n, last, sc.Err()
}

// readLedgerRuns counts the ledger records with a stage run since boot and
// returns the latest stage.
func readLedgerRuns(stateDir string, boot time.Time) (int, hookRun, error) {
	st, err := ledger.OpenReadOnly(stateDir)
	if err != nil {
		return 0, hookRun{}, err
	}
	recs, _ := st.List()
	n := 0
	var last hookRun
	for _, r := range recs {
		if !st.Current(r) {
			continue
		}
		counted := false
		for stage, at := range r.Stages {
			if at.Before(boot) {
				continue
			}
			if !counted {
				n++
				counted = true
			}
			if at.After(last.at) {
				last = hookRun{stage, at}
			}
		}
	}
	return n, last, nil
}

// HookAlive checks for evidence that the hook has run since boot: log lines
// or ledger stages. Without any, it says why it cannot tell, or warns when
// podman lists live containers the hook should have seen.
func HookAlive(in AliveInput) Check {
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	logN, logLast, logErr := readHookLog(in.LogFile, in.Boot, in.HostUID)
	recN, recLast, recErr := readLedgerRuns(in.StateDir, in.Boot)
	last := logLast
	if recLast.at.After(last.at) {
		last = recLast
	}
	var problems []string
	if logErr != nil && !errors.Is(logErr, fs.ErrNotExist) {
		problems = append(problems, "log: "+logErr.Error())
	}
	if recErr != nil && !errors.Is(recErr, fs.ErrNotExist) {
		problems = append(problems, "ledger: "+recErr.Error())
	}
	// A trace older than the latest recorded run is history: the state
	// dir has been fixed since.
	traced, files := ledger.ReadTrace(in.TraceFiles, in.Boot)
	// Only failures to write the state dir checked here: a hook
	// configured elsewhere (or a test's) is another matter.
	traced = slices.DeleteFunc(traced, func(e ledger.TraceEntry) bool { return filepath.Clean(e.StateDir) != filepath.Clean(in.StateDir) })
	// The latest by time: the trace files are read one after another,
	// and the last one's entries may be older than the first's.
	var latest ledger.TraceEntry
	if len(traced) > 0 {
		latest = slices.MaxFunc(traced, func(a, b ledger.TraceEntry) int { return a.Time.Compare(b.Time) })
	}
	if len(traced) > 0 && latest.Time.After(last.at) {
		// The hook fires but cannot keep its books: whatever it reaps goes
		// unrecorded, and what it could not reap is invisible to reconcile.
		e := latest
		c := newCheck(NameHookAlive, Error, "kc-hook ran but could not write its state dir %s %s since boot; last, %s ago at %s: %s (trace: %s)",
			e.StateDir, plural(len(traced), "time", "times"), in.Now.Sub(e.Time).Round(time.Second), e.Stage, e.Error, strings.Join(files, ", "))
		c.Items = problems
		c.Remedy = "fix the state dir (or KC_STATE_DIR in the hook's descriptor); this check passes once the hook records a run again"
		return c
	}
	if logN > 0 || recN > 0 {
		c := newCheck(NameHookAlive, OK, "%s and %s since boot; last: %s %s ago",
			plural(logN, "log line", "log lines"), plural(recN, "container recorded", "containers recorded"),
			last.stage, in.Now.Sub(last.at).Round(time.Second))
		c.Items = problems
		return c
	}
	where := fmt.Sprintf("nothing since boot (%s) in %s or %s/containers", in.Boot.Format(time.RFC3339), in.LogFile, in.StateDir)
	var c Check
	switch {
	case in.NoPodman:
		c = newCheck(NameHookAlive, OK, "cannot tell: %s; no engine asked here runs hooks from hooks.d (kc-janitor watch follows their containers' deaths)", where)
	case in.LiveContainers > 0:
		c = newCheck(NameHookAlive, Warn, "%s, yet podman lists %s: the hook does not fire, or runs with another state dir",
			where, plural(in.LiveContainers, "live container", "live containers"))
	case in.LiveContainers == 0:
		c = newCheck(NameHookAlive, OK, "cannot tell yet: %s, and podman lists no live container", where)
	default:
		c = newCheck(NameHookAlive, Warn, "cannot tell: %s, and podman could not be asked for live containers", where)
	}
	c.Items = problems
	return c
}
