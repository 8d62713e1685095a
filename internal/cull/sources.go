package cull

import (
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Sources are the supervisors a sweep found: its live control sockets,
// and those left unknown only because /status was slow while a live
// supervisor of the socket's owner listens there (its audit then says
// whether it answers; dropped, it would vanish from the report). A session
// socket is its server's, and any other control socket has no server to
// answer. A control socket the sweep's deadline left unprobed may be a
// live supervisor's: it is a source not audited (Source.NotProbed), not
// left out. Names of one socket file (hard links) are one supervisor,
// audited and counted once. notLive, if not nil, is told of every
// control socket left out.
func Sources(socks []*sweep.Socket, notLive func(*sweep.Socket)) []Source {
	var out []Source
	seen := map[[2]uint64]bool{}
	for _, s := range socks {
		if s.Kind != sockets.KindControl {
			continue
		}
		unprobed := s.Verdict == sweep.VerdictUnknown && s.Unprobed()
		if s.Verdict != sweep.VerdictLive && !unprobed && (s.Verdict != sweep.VerdictUnknown || !s.OwnerListens()) {
			if notLive != nil {
				notLive(s)
			}
			continue
		}
		if s.ID.Ino != 0 {
			key := [2]uint64{s.ID.Dev, s.ID.Ino}
			if seen[key] {
				continue
			}
			seen[key] = true
		}
		src := Source{Socket: s.Path, PID: s.PID, Owner: s.Owner, Pin: s.Pin}
		if unprobed {
			src.NotProbed = s.Reason
		}
		out = append(out, src)
	}
	return out
}
