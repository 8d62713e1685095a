package janitor

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// errNoPID: neither the engine nor the ledger gives the init's PID (a
// container not running, an engine that cannot be asked).
var errNoPID = errors.New("no init PID known")

// pinnable counts the live containers of answers whose init watch would
// pin, with watch's checks (each pidfd closed at once), and the others by
// reason, for doctor. ask is asked, as watch asks, for the init PIDs an
// engine's list gave none for.
func pinnable(s Settings, answers []engine.Answer, ask func(by listedBy, ids []string) map[string]int) (pinned, eventsOnly int, why []string) {
	root := s.Reconcile.Root
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	st, _ := openStore(s.StateDir, false) // doctor's state-dir check says why
	pids, byPID := map[string]int{}, map[int]int{}
	noPID := map[listedBy][]string{}
	for _, a := range answers {
		for _, c := range a.Containers {
			if _, seen := pids[c.ID]; seen || !c.Live || (len(s.Reconcile.Containers) > 0 && !s.Reconcile.Containers[c.ID]) {
				continue
			}
			pids[c.ID] = c.InitPID
			if c.InitPID <= 0 {
				noPID[listedIn(a)] = append(noPID[listedIn(a)], c.ID)
			}
		}
	}
	for by, ids := range noPID {
		var told map[string]int
		if ask != nil {
			told = ask(by, ids)
		}
		for _, id := range ids {
			if pid, ok := told[id]; ok {
				pids[id] = pid
			} else if pid := recordedPID(st, id); pid > 0 {
				pids[id] = pid
			}
		}
	}
	for _, pid := range pids {
		if pid > 0 {
			byPID[pid]++
		}
	}
	reasons := map[string]int{}
	for id, pid := range pids {
		var err error
		switch {
		case pid <= 0:
			err = errNoPID
		case byPID[pid] > 1:
			err = errSharedPID
		default:
			var p *fingerprint.Pinned
			if p, err = pinInit(root, id, pid, recordedStart(st, id, pid)); err == nil {
				p.Close()
			}
		}
		if err == nil {
			pinned++
			continue
		}
		eventsOnly++
		reasons[reason(err)]++
	}
	for _, r := range slices.Sorted(maps.Keys(reasons)) {
		why = append(why, fmt.Sprintf("%d %s", reasons[r], r))
	}
	return pinned, eventsOnly, why
}

// reason is err's kind, for counting.
func reason(err error) string {
	for _, e := range []error{errNoPID, errInitDead, errInitUnseen, errStartMismatch, errNotItsCgroup, errNotPIDNSInit, errSharedPID} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}
