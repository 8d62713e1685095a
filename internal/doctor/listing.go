package doctor

import (
	"fmt"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/taskiter"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// Listing says how scans list this host's processes under the --bpf
// setting, so that an operator sees whether kc-watchman loads BPF
// programs here and, if auto falls back to /proc, why. A fallback is not
// a fault (scans are slower, not wrong); a required iterator that cannot
// load is, since every scan will then fail.
func Listing(lister trees.Lister) Check {
	if lister == trees.ListProc {
		return newCheck(NameListing, OK, "/proc; --bpf off loads no BPF program")
	}
	n, tasks, sawInit, start := 0, 0, false, time.Now()
	census, err := taskiter.Each(func(t *taskiter.Task) {
		n++
		tasks += t.Threads
		sawInit = sawInit || t.PID == 1
	})
	took := time.Since(start).Round(100 * time.Microsecond)
	switch {
	case err == nil:
		detail := fmt.Sprintf("BPF task iterator: %s in %s", plural(n, "process", "processes"), took)
		switch unlisted, exact := census.Unlisted(tasks); {
		case exact && unlisted == 0:
			detail += "; it listed every process"
		case exact && !sawInit && initTasks() == unlisted:
			detail += "; it left out PID 1 alone, which scans read from /proc"
		case exact:
			detail += fmt.Sprintf("; it left out processes holding %s, so scans check its listing against /proc's", plural(unlisted, "task", "tasks"))
		default:
			detail += "; processes came and went during the pass"
		}
		return newCheck(NameListing, OK, "%s", detail)
	case lister == trees.ListBPF:
		return newCheck(NameListing, Error, "--bpf on, but the BPF task iterator cannot be used: %v", err)
	}
	return newCheck(NameListing, OK, "/proc; the BPF task iterator cannot be used here: %v", err)
}

// initTasks is PID 1's thread count, or -1.
func initTasks() int {
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, 1)
	if err != nil {
		return -1
	}
	return st.Threads
}
