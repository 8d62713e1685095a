package doctor

import (
	"fmt"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// Listing says how scans list this host's processes under the --bpf
// setting, so that an operator sees whether kc-watchman loads BPF
// programs here and, if auto falls back to /proc, why. A fallback is not
// a fault (scans are slower, not wrong); a required iterator that cannot
// load is, since every scan will then fail. It lists as a scan does
// (proctable.List), without the /proc confirmation the census may call
// for: what the iterator did is what it reports.
func Listing(lister proctable.Lister) Check {
	if lister == proctable.ListProc {
		return newCheck(NameListing, OK, "/proc; --bpf off loads no BPF program")
	}
	start := time.Now()
	l, err := proctable.List(proctable.Options{Lister: lister, Defer: true})
	return listingCheck(lister, l, err, time.Since(start).Round(100*time.Microsecond))
}

// listingCheck judges a listing made under lister. A fallback for want of
// the iterator is a fact of the host; one because a pass went wrong here
// is worth a report, though scans stay right.
func listingCheck(lister proctable.Lister, l *proctable.Listing, err error, took time.Duration) Check {
	switch {
	case err != nil && lister == proctable.ListBPF:
		return newCheck(NameListing, Error, "--bpf on, but the BPF task iterator cannot be used: %v", err)
	case err != nil:
		c := newCheck(NameListing, Error, "listing the processes: %v", err)
		c.Remedy = procRemedy
		return c
	case l.Lister != "bpf" && l.Refused:
		c := newCheck(NameListing, Warn, "/proc; the BPF task iterator runs here, but its pass was refused: %s (scans are slower, not wrong)", l.Fallback)
		c.Remedy = "report it with this kernel's version (uname -r); --bpf off stops the attempts"
		return c
	case l.Lister != "bpf":
		return newCheck(NameListing, OK, "/proc; the BPF task iterator cannot be used here: %s", l.Fallback)
	}
	detail := fmt.Sprintf("BPF %s: %s in %s", l.Method, plural(len(l.PIDs)-l.Missed, "process", "processes"), took)
	switch {
	case l.Unvouched != "":
		detail += "; " + l.Unvouched + ", so scans check its listing against /proc's"
	case l.Missed > 0:
		detail += "; it left out PID 1 alone, which scans read from /proc"
	default:
		detail += "; it listed every process"
	}
	return newCheck(NameListing, OK, "%s", detail)
}
