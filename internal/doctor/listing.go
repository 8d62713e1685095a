package doctor

import (
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
	_, err := taskiter.Each(func(*taskiter.Task) { n++ })
	took := time.Since(start).Round(100 * time.Microsecond)
	switch {
	case err == nil:
		return newCheck(NameListing, OK, "BPF task iterator: %s in %s", plural(n, "process", "processes"), took)
	case lister == trees.ListBPF:
		return newCheck(NameListing, Error, "--bpf on, but the BPF task iterator cannot be used: %v", err)
	}
	return newCheck(NameListing, OK, "/proc; the BPF task iterator cannot be used here: %v", err)
}
