package cull

import (
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// Sources are the supervisors a sweep found alive: its live control
// sockets, the only ones whose /sessions are worth asking for. A session
// socket is its server's, and a control socket that is stale or unknown
// has no server to answer. notLive, if not nil, is told of every control
// socket left out.
func Sources(socks []*sweep.Socket, notLive func(*sweep.Socket)) []Source {
	var out []Source
	for _, s := range socks {
		if s.Kind != sockets.KindControl {
			continue
		}
		if s.Verdict != sweep.VerdictLive {
			if notLive != nil {
				notLive(s)
			}
			continue
		}
		out = append(out, Source{Socket: s.Path, PID: s.PID, Pin: s.Pin})
	}
	return out
}
