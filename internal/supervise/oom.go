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

// matchOOMScore gives the wrapper, and so the command and kernels it
// starts, the container init's oom_score_adj. The wrapper inherits the
// runtime's: containerd's shim sets itself to containerd's score + 1
// (about -998), conmon to -1000, and runc passes it on. Kept, the
// supervisor and every kernel would be all but immune to the OOM killer,
// which would take the container, or the host's own processes, before a
// runaway kernel. A score that cannot be read or set leaves the
// inherited one, with a warning: the command is started all the same.
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
	if err == nil && own == want {
		return
	}
	if err := os.WriteFile(selfOOMScore, []byte(strconv.Itoa(want)), 0); err != nil {
		r.log.Warn("oom_score_adj not set to the container init's; the command keeps the wrapper's", "oom_score_adj", own, "init_oom_score_adj", want, "err", err)
		return
	}
	r.log.Info("oom_score_adj set to the container init's", "from", own, "to", want)
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
