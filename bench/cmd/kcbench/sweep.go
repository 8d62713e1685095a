package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sweepFixture lays out 1000 supervisor sockets in one directory:
//
//   - live: 10 fake supervisors, each with its control socket and 48
//     session sockets (490), all answering;
//   - hung: 10 fake supervisors with --hang (10 control sockets): they
//     accept and never answer, so gate 3 runs into its timeouts twice;
//   - stale: 100 fake supervisors with 4 session sockets each, killed with
//     SIGKILL, which leaves their 500 sockets behind, as Kallichore does.
type sweepFixture struct {
	Dir               string
	Live, Hung, Stale int
	liveSrv, hungSrv  []*child
}

func newSweepFixture(pop *population, kcserver, dir string) (*sweepFixture, error) {
	f := &sweepFixture{Dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sessions := func(n int, tag string) (string, error) {
		var list []map[string]any
		for i := range n {
			list = append(list, map[string]any{
				"session_id": fmt.Sprintf("%s%04d-%s", tag, i, strings.Repeat("0", 8)),
				"language":   "python", "status": "idle", "connected": false, "idle_seconds": 10,
			})
		}
		data, _ := json.Marshal(list)
		p := filepath.Join(pop.tmp, fmt.Sprintf("sessions-%s-%d.json", tag, n))
		return p, os.WriteFile(p, data, 0o644)
	}
	live48, err := sessions(48, "l")
	if err != nil {
		return nil, err
	}
	stale4, err := sessions(4, "s")
	if err != nil {
		return nil, err
	}
	for range 10 {
		c, _, err := pop.startKCServer(kcserver, "sweep-live", "", []string{"KCFAKE_SESSIONS=" + live48, "KCFAKE_OPEN_CHANNELS=1"}, "--socket-dir="+dir)
		if err != nil {
			return nil, err
		}
		f.liveSrv = append(f.liveSrv, c)
		f.Live += 49
	}
	for range 10 {
		c, _, err := pop.startKCServer(kcserver, "sweep-hung", "", []string{"KCFAKE_HANG=1"}, "--socket-dir="+dir)
		if err != nil {
			return nil, err
		}
		f.hungSrv = append(f.hungSrv, c)
		f.Hung++
	}
	for range 100 {
		c, _, err := pop.startKCServer(kcserver, "sweep-stale", "", []string{"KCFAKE_SESSIONS=" + stale4, "KCFAKE_OPEN_CHANNELS=1"}, "--socket-dir="+dir)
		if err != nil {
			return nil, err
		}
		pop.reap(c) // SIGKILL: the sockets stay behind
		f.Stale += 5
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	if len(ents) != f.Live+f.Hung+f.Stale {
		return nil, fmt.Errorf("sweep fixture: %d files in %s, want %d", len(ents), dir, f.Live+f.Hung+f.Stale)
	}
	return f, nil
}

// stop ends the fixture's supervisors (their sockets are removed with the
// directory).
func (f *sweepFixture) stop(pop *population) {
	for _, c := range append(f.liveSrv, f.hungSrv...) {
		pop.reap(c)
	}
}

// seedSweepCost is the seed sweeper's cost for the fixture, computed from
// its documented sequential algorithm rather than measured (it would take
// about 19 minutes): sockets are probed one after the other; a socket
// whose /status handshake is silent is probed a second time after a 2 s
// pause; one probe gives up after 5 s. A stale socket (nobody listening)
// fails at once, so it costs the pause; a hung one costs 5 s + 2 s + 5 s;
// a live one answers at once. Process start-up of the probes (the seed
// runs python3/node inside the container for each) is not counted, so this
// is a lower bound.
func seedSweepCost(live, hung, stale int) time.Duration {
	const pause, timeout = 2 * time.Second, 5 * time.Second
	return time.Duration(stale)*pause + time.Duration(hung)*(timeout+pause+timeout) + time.Duration(live)*0
}
