package doctor

import (
	"fmt"
	"time"

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
	n, start := 0, time.Now()
	census, err := taskiter.Each(func(*taskiter.Task) { n++ })
	took := time.Since(start).Round(100 * time.Microsecond)
	switch {
	case err == nil:
		detail := fmt.Sprintf("BPF task iterator: %s in %s", plural(n, "process", "processes"), took)
		switch missed, exact := census.Unvisited(); {
		case exact && missed == 0:
			detail += "; it visited every task"
		case exact:
			detail += fmt.Sprintf("; it skipped %s, so scans check its listing against /proc's", plural(missed, "task", "tasks"))
		default:
			detail += "; tasks came and went during the pass, so scans check its listing against /proc's"
		}
		return newCheck(NameListing, OK, "%s", detail)
	case lister == trees.ListBPF:
		return newCheck(NameListing, Error, "--bpf on, but the BPF task iterator cannot be used: %v", err)
	}
	return newCheck(NameListing, OK, "/proc; the BPF task iterator cannot be used here: %v", err)
}
