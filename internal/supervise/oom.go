package supervise

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// selfOOMScore is the file the wrapper's own score is read from and
// written to: the real /proc's, whatever Options.Root reads the init by.
const selfOOMScore = "/proc/self/oom_score_adj"

// oomScores is the command's oom_score_adj (the container init's) and the
// wrapper's own, which it keeps.
type oomScores struct{ command, own int }

// matchOOMScore decides the command's oom_score_adj: the container
// init's. The wrapper inherits the runtime's: containerd's shim sets
// itself to containerd's score + 1 (about -998), conmon to -1000, and runc
// passes it on. Kept, the supervisor and every kernel would be all but
// immune to the OOM killer, which would take the container, or the
// host's own processes, before a runaway kernel. A score that cannot be
// read leaves the inherited one, with a warning: the command is started
// all the same.
func (r *runner) matchOOMScore() {
	want, err := readOOMScore(filepath.Join(r.o.Root, strconv.Itoa(r.o.Init.PID), "oom_score_adj"))
	if err != nil {
		r.log.Warn("the container init's oom_score_adj could not be read; the command keeps the wrapper's", "err", err)
		return
	}
	// Read after the score: it is the init's only if the init is still
	// the process watched.
	if _, err := fingerprint.Revalidate(r.o.Root, r.o.Init); err != nil {
		return // the init is gone: the wait that follows sees it
	}
	own, err := readOOMScore(selfOOMScore)
	if err != nil {
		r.log.Warn("the wrapper's own oom_score_adj could not be read; the command keeps it", "err", err)
		return
	}
	if own != want {
		r.oom = &oomScores{command: want, own: own}
	}
}

// withOOMScore runs start (the command's fork) with the wrapper at the
// command's score, which the child inherits, and then gives the wrapper
// its own back: it is outside the container's memory cgroup, and the OOM
// killer taking it would leave the tree unwatched. Going back down needs
// no privilege when the wrapper's own score is its floor (the common
// case); where it is not, the wrapper keeps the command's, and says so.
func (r *runner) withOOMScore(start func() error) error {
	o := r.oom
	if o == nil {
		return start()
	}
	if err := os.WriteFile(selfOOMScore, []byte(strconv.Itoa(o.command)), 0); err != nil {
		r.log.Warn("oom_score_adj not set to the container init's; the command keeps the wrapper's", "oom_score_adj", o.own, "init_oom_score_adj", o.command, "err", err)
		r.oom = nil
		return start()
	}
	err := start()
	if werr := os.WriteFile(selfOOMScore, []byte(strconv.Itoa(o.own)), 0); werr != nil {
		r.log.Warn("the wrapper keeps the command's oom_score_adj", "oom_score_adj", o.command, "err", werr)
		o.own = o.command // nothing to go back to any more
	}
	return err
}

func readOOMScore(path string) (int, error) {
	data, err := fingerprint.ReadCapped(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(string(bytes.TrimSpace(data)))
	if err != nil || v < -1000 || v > 1000 {
		return 0, fmt.Errorf("%s: not an oom_score_adj: %q", path, data)
	}
	return v, nil
}
