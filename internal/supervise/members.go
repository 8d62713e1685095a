package supervise

import (
	"errors"
	"log/slog"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// memberJudge holds the wrapper's own teardown to the rules every other
// kill of a tree follows (DESIGN "Killing safely", "Identity rules"): a
// group member that runs wholly as neither the wrapper's UID nor its
// command's (a command the allowlist starts through setpriv runs as the
// user it names, and so do its kernels; one that ran another setpriv,
// runuser or a setuid program does not), or that carries another
// container's ID, is not signalled, whether or not it left the group.
// Each member is judged once, by PID and start time; KillOthers checks
// the UID again, through the pidfd, right before each signal.
type memberJudge struct {
	root  string
	rules trees.Rules
	log   *slog.Logger
	// judged maps a member (PID and start) to whether it may be
	// signalled; withheld lists those that may not, in judging order.
	judged   map[fingerprint.Stat]bool
	withheld []fingerprint.Stat
}

// newMemberJudge judges by uids (none: nothing may be signalled).
func newMemberJudge(root string, uids []int, containerID string, log *slog.Logger) *memberJudge {
	rules := trees.Rules{UID: -1, ContainerID: containerID}
	if len(uids) > 0 {
		rules.UID, rules.AlsoUIDs = uids[0], uids[1:]
	}
	return &memberJudge{root: root, rules: rules, log: log, judged: map[fingerprint.Stat]bool{}}
}

// filter wraps a lister of the groups' members to return only those the
// wrapper may signal.
func (j *memberJudge) filter(list func(groups []int) []fingerprint.Stat) func(groups []int) []fingerprint.Stat {
	return func(groups []int) []fingerprint.Stat {
		var out []fingerprint.Stat
		for _, m := range list(groups) {
			if j.allows(m) {
				out = append(out, m)
			}
		}
		return out
	}
}

func (j *memberJudge) allows(m fingerprint.Stat) bool {
	key := fingerprint.Stat{PID: m.PID, StartTicks: m.StartTicks}
	if ok, seen := j.judged[key]; seen {
		return ok
	}
	id, err := fingerprint.Read(j.root, m.PID)
	switch {
	case err == nil && id.StartTicks != m.StartTicks,
		errors.Is(err, fingerprint.ErrNotFound), errors.Is(err, fingerprint.ErrNotProcess):
		// Gone, or its PID is another's now: nothing to signal, and
		// nothing to remember.
		return false
	case err != nil:
		// An argv that cannot be read may carry another container's ID.
		j.withhold(key, m)
		j.log.Warn("group member not signalled: unreadable", "pid", m.PID, "comm", m.Comm, "err", err)
		return false
	case !j.rules.Member(id):
		j.withhold(key, m)
		j.log.Warn("group member not signalled: another UID's (or setuid) or another container's",
			"pid", id.PID, "comm", id.Comm, "uid", id.UID, "euid", id.EUID, "suid", id.SUID)
		return false
	}
	j.judged[key] = true
	return true
}

func (j *memberJudge) withhold(key, m fingerprint.Stat) {
	j.judged[key] = false
	j.withheld = append(j.withheld, m)
}

// left returns the withheld members still alive.
func (j *memberJudge) left() []fingerprint.Stat {
	var out []fingerprint.Stat
	for _, m := range j.withheld {
		if fingerprint.Alive(j.root, m) {
			out = append(out, m)
		}
	}
	return out
}
