// Package oneshot tunes the Go runtime for a process that does one job
// and exits, and whose memory the host's process table bounds: a kc-hook
// stage, a kc-janitor reconcile.
package oneshot

import (
	"os"
	"runtime/debug"
)

// MemoryLimit is the heap at which the collector runs again for a tuned
// process: far above what a run needs at 10,000 processes (kc-hook
// poststop peaks at 7 MB, a reconcile at 20 MB), and half the
// MemoryMax=256M of the shipped units, so a run that holds more than
// expected is collected, not killed.
const MemoryLimit = 128 << 20

// Tune turns the garbage collector off, with MemoryLimit as the heap at
// which it runs after all, unless GOGC or GOMEMLIMIT is set: then the
// operator's settings rule. Such a run allocates a few megabytes and
// exits; the collections the default settings make it run cost a
// reconcile at 10,000 processes a sixth of its CPU and leave its peak
// memory as it was. Not for long-running commands (watch, supervise), nor
// for those whose memory other users' sockets drive (sweep, cull): their
// garbage would pile up to the limit.
func Tune() {
	for _, v := range []string{"GOGC", "GOMEMLIMIT"} {
		if _, set := os.LookupEnv(v); set {
			return
		}
	}
	debug.SetMemoryLimit(MemoryLimit)
	debug.SetGCPercent(-1)
}
