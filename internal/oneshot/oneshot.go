// Package oneshot tunes the Go runtime for a process that does one job
// and exits: a kc-hook stage, a kc-janitor reconcile.
package oneshot

import (
	"os"
	"runtime/debug"
)

// MemoryLimit is the heap at which the collector runs again for a tuned
// process: far above what a run needs at 10,000 processes (kc-hook
// poststop peaks at 7 MB, a reconcile at 20 MB), so only a run that
// holds much more than that pays for collections.
const MemoryLimit = 256 << 20

// Tune turns the garbage collector off, with MemoryLimit as the heap at
// which it runs after all, unless GOGC (or, for the limit, GOMEMLIMIT)
// says otherwise. Such a run allocates a few megabytes and exits; the
// collections the default settings make it run cost a reconcile at
// 10,000 processes a sixth of its CPU and leave its peak memory as it
// was. Long-running commands (watch, supervise) must not call it.
func Tune() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(MemoryLimit)
	}
	debug.SetGCPercent(-1)
}
