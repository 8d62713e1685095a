package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/metrics"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
)

// backoff bounds re-subscribing to an engine whose event stream dropped.
type backoff struct {
	min, max time.Duration
	// healthy: a stream that lasted this long was working, and the next
	// drop starts again from min.
	healthy time.Duration
}

// resubscribe is watch's backoff: quick after a blip, at most twice a
// minute while an engine is down.
func resubscribe() backoff {
	return backoff{min: 250 * time.Millisecond, max: 30 * time.Second, healthy: time.Minute}
}

// stillLiveRetries are the waits between the attempts at a death the
// engines, or the local evidence (DESIGN "Ground truth must be corroborated"), still call live. dockerd
// emits "die" before its container list says "exited"; under --engine
// auto containerd's /tasks/exit of a Docker container comes before
// either; a containerd shim outlives its task's deletion by a moment:
// what is seen right after a death can be stale. Each attempt scans and
// asks again; nothing is decided against a live answer.
func stillLiveRetries() []time.Duration {
	out := make([]time.Duration, 9)
	for i := range out {
		out[i] = 10 * time.Millisecond << i // 10 ms … 2.56 s: 5.1 s in all
	}
	return out
}

// coalesceWindow: a death of a container handled this recently may be the
// same death reported again (Docker's "die", then containerd's
// /tasks/exit and /tasks/delete of its task in the moby namespace).
const coalesceWindow = 10 * time.Second

// sameDeathSlack: a report of a death at most this much later than the one
// handled (by their At) is that death again: engines stamp it when they
// notice, a pidfd at once, podman's "died" once its cleanup ran. A later
// one is a new death of the container (restarted since) and is handled.
const sameDeathSlack = 2 * time.Second

// settledDeath is a container's death handled and settled.
type settledDeath struct {
	at, done time.Time
	// pid is the init whose pidfd reported it (0: an engine's event): a
	// pidfd report of another init is another death, whenever it came.
	pid int
	// spared: a tree of the container was spared as younger than the
	// death (SkipYoung), which a later time may judge: a restarted run's,
	// dead again within the slack (Docker's restart policy retries
	// within a second).
	spared bool
}

// sameDeath reports whether d is the death s settled, reported again.
func (s settledDeath) sameDeath(d engine.Death) bool {
	if s.pid > 0 && d.Via == "pidfd" && d.PID > 0 {
		// An init dies once: its pidfd's word, however late.
		return d.PID == s.pid
	}
	if s.spared && d.At.After(s.at) {
		return false
	}
	return !d.At.After(s.at.Add(sameDeathSlack))
}

// redoOf reports whether d is the death s settled, reported again, and
// decided anew only because s spared a younger tree.
func (s settledDeath) redoOf(d engine.Death) bool {
	return s.spared && settledDeath{at: s.at, pid: s.pid}.sameDeath(d)
}

// followDeaths subscribes to e's death events and passes each death to
// onDeath until ctx is done, re-subscribing with backoff when the stream
// drops. ready, if set, is called once each subscription is in place,
// resumed telling whether one dropped before it; onSkip, if set, once per
// message the engine's stream passed over (logged here). It returns nil
// when ctx is done, and the engine's error when it has no death events.
func followDeaths(ctx context.Context, e engine.Engine, bo backoff, log *slog.Logger, ready func(resumed bool), onDeath func(engine.Death), onSkip func()) error {
	log = log.With("engine", e.Name(), "endpoint", e.Endpoint())
	delay := bo.min
	// From the moment watch asked: a death between asking and dockerd
	// subscribing is replayed. After a drop, from the last death's own
	// time as the engine stamped it (the stream had none after it), never
	// from local wall time at the drop: the engine's replay goes by its
	// stamps, and a clock stepped back between a death and the drop made
	// a re-subscription from "now" skip the gap, silently.
	since := time.Now()
	// The death at since comes again in the replay, hours later maybe
	// (past the handler's coalescing): passed on once. Deaths reach this
	// one at a time, from this goroutine's stream. The last one, not the
	// latest stamp: after a step back, later deaths carry earlier stamps.
	var last engine.Death
	deliver := func(d engine.Death) {
		if last.ID != "" && d.ID == last.ID && d.At.Equal(last.At) {
			return
		}
		last, since = d, d.At
		onDeath(d)
	}
	for resumed := false; ; resumed = true {
		start := time.Now()
		err := e.Deaths(ctx, engine.DeathWatch{
			Since: since,
			Ready: func() {
				log.Info("following container deaths", "resumed", resumed)
				if ready != nil {
					ready(resumed)
				}
			},
			Death: deliver,
			Skipped: func(reason string, size int64) {
				log.Warn("event message passed over; the stream goes on", "reason", reason, "bytes", size, "max_bytes", engine.MaxEventMessage)
				if onSkip != nil {
					onSkip()
				}
			},
		})
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, engine.ErrNoEvents) {
			return err
		}
		if err == nil {
			err = errors.New("the event stream ended")
		}
		if time.Since(start) >= bo.healthy {
			delay = bo.min
		}
		log.Warn("container death events dropped; subscribing again", "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(delay*2, bo.max)
	}
}

// deathHandler reconciles the trees of a container the moment an engine
// reports its death, with the round's decision table and options.
type deathHandler struct {
	w   Watch
	log *slog.Logger
	// serial is held by every round's reconcile step and every attempt
	// here: never two reaps at once. Sweeps and culls do not hold it.
	serial *sync.Mutex
	// work is the rounds' context: a handling under way finishes on the
	// first signal and is abandoned on the second, as a round is.
	work context.Context
	// stop ends the waits between attempts.
	stop    context.Context
	retries []time.Duration
	// attempt is Reconcile with watch's settings.
	attempt func(ctx context.Context, opt reconcile.Options, log *slog.Logger) (rep Report, liveErr, err error)

	mu         sync.Mutex
	closed     bool
	catchingUp bool
	// catchUpNext: the engines whose catch-up was asked for while one ran.
	catchUpNext []string
	// catchUpRetries: catchUpRetries, or a test's.
	catchUpRetries []time.Duration
	inFlight       map[string]bool
	// again: deaths reported again while their first report was being
	// handled (a pidfd, then the engine's event); handled anew if that
	// handling ends with the container still live, so that an engine
	// slower to agree than the retries are long (dockerd in a drain)
	// does not lose the death to the next round, or if it is a later
	// death (settledDeath.sameDeath).
	again map[string]engine.Death
	// nudges wakes the wait between attempts of the handling a death is
	// in when another source reports it: dockerd's "die" comes when it
	// has finished with the container, which is when its answers stop
	// calling it running. A drain's deaths are then decided as the
	// engine catches up, not on the next step of the backoff (up to
	// 2.56 s later).
	nudges  map[string]chan struct{}
	pending []engine.Death // this burst window's, not yet handled
	// scans counts the attempts made, each one scan and one engine
	// question: a burst costs one, not one per death.
	scans  atomic.Int64
	recent map[string]settledDeath
	// redo marks a death handled anew only because its first decision
	// spared a tree as younger (settledDeath.spared): decided once more,
	// by the later time, and not counted again.
	redo     map[string]bool
	handled  map[string]int  // by engine, for the metrics file
	skipped  map[string]int  // event messages passed over, by engine
	followed map[string]bool // reported at 0 until a death
	pins     *pinner         // nil without pidfds
	wg       sync.WaitGroup
}

func newDeathHandler(w Watch, log *slog.Logger, serial *sync.Mutex, work, stop context.Context) *deathHandler {
	return &deathHandler{w: w, log: log, serial: serial, work: work, stop: stop, retries: stillLiveRetries(), catchUpRetries: catchUpRetries,
		inFlight: map[string]bool{}, again: map[string]engine.Death{}, nudges: map[string]chan struct{}{}, recent: map[string]settledDeath{}, redo: map[string]bool{}, handled: map[string]int{}, skipped: map[string]int{}, followed: map[string]bool{}}
}

// burstWindow: deaths that arrive this close together (a pod's
// containers, killed at once) are decided together, on one scan and one
// engine question (DESIGN "One view of the host"). The first death of a
// burst waits this long, so it is short: a death that misses it joins
// the next handling, which takes every death that arrived while the one
// before decided and reaped (a node drain's come hundreds of ms apart),
// and one container's second report (pidfd, then engine event) is
// coalesced whenever it comes.
const burstWindow = 5 * time.Millisecond

// death takes one reported death; it never blocks the event stream.
func (h *deathHandler) death(d engine.Death) {
	log := h.log.With("engine", d.Engine, "container", d.ID)
	if scope := h.w.Reconcile.Containers; len(scope) > 0 && !scope[d.ID] {
		log.Debug("container death outside --container; left alone")
		return
	}
	if h.pins != nil {
		h.pins.died(d.ID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	now := time.Now()
	for id, s := range h.recent {
		if now.Sub(s.done) > coalesceWindow {
			delete(h.recent, id)
		}
	}
	s, seen := h.recent[d.ID]
	if seen && !s.sameDeath(d) {
		seen = false
		delete(h.recent, d.ID)
		if s.redoOf(d) {
			h.redo[d.ID] = true
		}
	}
	if seen || h.inFlight[d.ID] {
		if !seen {
			// The latest report: a later death must not be overwritten
			// by a late report of the one being handled.
			if old, ok := h.again[d.ID]; !ok || d.At.After(old.At) {
				h.again[d.ID] = d
			}
			select {
			case h.nudges[d.ID] <- struct{}{}: // a nil channel never takes
			default:
			}
		}
		log.Debug("container death already being handled or just handled; coalesced")
		return
	}
	h.inFlight[d.ID] = true
	h.pending = append(h.pending, d)
	if len(h.pending) == 1 {
		h.wg.Add(1)
		time.AfterFunc(burstWindow, h.flush)
	}
}

// flush hands the deaths gathered in one burst window to one handling.
// The burst is closed only once the lock is free: deaths that arrive
// while another handling (or a round) reaps join it, so a drain's deaths,
// reported one after the other, queue into one pass behind the first
// reap, not into one pass each.
func (h *deathHandler) flush() {
	h.serial.Lock()
	h.mu.Lock()
	batch := h.pending
	h.pending = nil
	h.mu.Unlock()
	h.serial.Unlock()
	h.handle(batch)
}

// catchUp reconciles every tree in watch's scope once eng's deaths are
// followed again after a drop: containerd keeps no events to replay and
// dockerd only its last 256, so a death while the stream was down would
// otherwise wait for the next round. One at a time: one asked for while
// another runs runs after it (once, for every engine that asked
// meanwhile: two streams back a moment apart, the second engine may have
// been down for the first). One whose ground truth is unknown (an
// engine still restarting) is tried again with backoff, up to
// catchUpRetries, then left to the round.
func (h *deathHandler) catchUp(eng string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if h.catchingUp {
		h.catchUpNext = append(h.catchUpNext, eng)
		return
	}
	h.catchingUp = true
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		engs := []string{eng}
		for {
			h.catchUpOnce(strings.Join(engs, ","))
			h.mu.Lock()
			engs, h.catchUpNext = h.catchUpNext, nil
			if len(engs) == 0 || h.closed {
				h.catchingUp = false
				h.mu.Unlock()
				return
			}
			h.mu.Unlock()
			slices.Sort(engs)
			engs = slices.Compact(engs)
		}
	}()
}

// catchUpRetries are the waits before each new try of a catch-up whose
// ground truth was unknown: about half a minute in all.
var catchUpRetries = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}

// catchUpOnce is one catch-up, for engines eng, tried again while the
// ground truth is unknown.
func (h *deathHandler) catchUpOnce(eng string) {
	log := h.log.With("engine", eng)
	defer func() {
		if r := recover(); r != nil {
			log.Error("catching up crashed; the next round covers it", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	opt := h.w.Reconcile
	opt.Logger = log
	for try := 0; ; try++ {
		rep, liveErr, err, _ := h.locked(opt, log)
		switch {
		case liveErr != nil && try < len(h.catchUpRetries):
			log.Warn("not caught up after the event stream was down: ground truth unknown; nothing touched, trying again", "err", liveErr, "retry_in", h.catchUpRetries[try].String())
			if _, ok := h.wait(h.catchUpRetries[try], nil); !ok || h.isClosed() {
				return
			}
			continue
		case liveErr != nil:
			log.Error("not caught up after the event stream was down: ground truth unknown; nothing touched", "err", liveErr)
		case errors.Is(err, errStopping):
		case err != nil:
			log.Error("not caught up after the event stream was down; the next round covers it", "err", err)
		default:
			logTrees(h.work, log, rep.Report)
			lvl, msg := slog.LevelInfo, "caught up after the event stream was down"
			if rep.Unrecorded != nil {
				lvl, msg = slog.LevelError, msg+", but reaped without recording in the ledger: the audit trail of these kills is missing"
			}
			log.Log(context.Background(), lvl, msg, "trees", len(rep.Trees),
				"reaped", rep.Count(action.Reaped)+rep.Count(action.Gone), "would_reap", rep.Count(action.WouldReap),
				"would_not_die", rep.Count(action.WouldNotDie), "dry_run", rep.DryRun, "unrecorded", rep.Unrecorded)
		}
		return
	}
}

func (h *deathHandler) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// close stops taking deaths and waits for those under way.
func (h *deathHandler) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.wg.Wait()
}

// handle reconciles the trees of a burst's containers through
// ScanThenAsk, one scan for all of them, asking again about those the
// engines still call live.
func (h *deathHandler) handle(batch []engine.Death) {
	defer h.wg.Done()
	settled := map[string]bool{}
	spared := map[string]bool{} // settledDeath.spared
	// uncounted are deaths still live after every attempt: counted once
	// here unless another report of them is handled anew (and counted
	// there): one death, one count.
	uncounted := map[string]engine.Death{}
	defer func() {
		var anew []engine.Death
		h.mu.Lock()
		for _, d := range batch {
			delete(h.inFlight, d.ID)
			delete(h.nudges, d.ID)
			done := settledDeath{at: d.At, done: time.Now(), spared: spared[d.ID]}
			if d.Via == "pidfd" {
				done.pid = d.PID
			}
			if settled[d.ID] {
				h.recent[d.ID] = done
			}
			if r, ok := h.again[d.ID]; ok {
				delete(h.again, d.ID)
				if !settled[d.ID] || !done.sameDeath(r) {
					if settled[d.ID] && done.redoOf(r) {
						h.redo[r.ID] = true
					}
					anew = append(anew, r)
				}
			}
		}
		h.mu.Unlock()
		for _, d := range anew {
			delete(uncounted, d.ID)
		}
		for _, d := range uncounted {
			h.tally(d, false)
		}
		for _, d := range anew {
			h.log.Debug("container death reported again while it was handled, undecided or a later death; handled anew", "engine", d.Engine, "container", d.ID)
			h.death(d)
		}
	}()
	logOf := func(d engine.Death) *slog.Logger { return h.log.With("engine", d.Engine, "container", d.ID) }
	defer func() {
		if r := recover(); r != nil {
			for _, d := range batch {
				logOf(d).Error("handling a container death crashed; the next round covers it", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
		}
	}()

	start := time.Now()
	waiting := map[string]engine.Death{}
	redo := map[string]bool{}
	nudge := make(chan struct{}, 1)
	h.mu.Lock()
	for _, d := range batch {
		waiting[d.ID] = d
		h.nudges[d.ID] = nudge
		redo[d.ID] = h.redo[d.ID]
		delete(h.redo, d.ID)
	}
	h.mu.Unlock()
	log := h.log
	if len(batch) == 1 {
		log = logOf(batch[0])
	} else {
		log.Debug("container deaths decided together", "burst", len(batch))
	}
	waits := 0 // the backoff's steps taken; a nudged attempt takes none
	var budget, unknownFor time.Duration
	for _, r := range h.retries {
		budget += r
	}
	for attempts := 1; len(waiting) > 0; attempts++ {
		opt := h.w.Reconcile
		opt.Containers = map[string]bool{}
		opt.DiedAtByID = map[string]time.Time{}
		opt.InitExited = map[string]int{}
		for id, d := range waiting {
			opt.Containers[id] = true
			opt.DiedAtByID[id] = d.At
			if d.Via == "pidfd" {
				opt.InitExited[id] = d.PID
			}
		}
		opt.Logger = log
		rep, liveErr, err, took := h.locked(opt, log)
		// The budget is the backoff's sum in time, not only in steps: an
		// engine that hangs to its timeout on every attempt would hold
		// the rounds for ten of them. Only the attempts whose truth was
		// unknown count: not the wait for the lock behind a round, nor a
		// burst-mate's grace.
		if liveErr != nil {
			unknownFor += took
		}
		last := waits >= len(h.retries) || unknownFor >= budget
		var again []string
		for _, id := range slices.Sorted(maps.Keys(waiting)) {
			d := waiting[id]
			one := only(rep, id)
			stillLive := err == nil && (liveErr != nil || one.Count(action.SkipLive)+one.Count(action.SkipContradicted) > 0)
			if stillLive && !last {
				logOf(d).Debug("dead container still looks live", "attempt", attempts, "skipped_live", one.Count(action.SkipLive),
					"skipped_contradicted", one.Count(action.SkipContradicted), "truth_unknown", liveErr != nil)
				again = append(again, id)
				continue
			}
			delete(waiting, id)
			h.report(d, logOf(d), one, liveErr, err, attempts, start, len(batch), !stillLive && !redo[id])
			if stillLive && liveErr == nil && !redo[id] {
				uncounted[id] = d
			}
			// A container still live after every attempt was restarted,
			// or its task was killed and not deleted (the shim lives on):
			// its next death or /tasks/delete must not be coalesced away.
			settled[id] = !stillLive
			spared[id] = one.Count(action.SkipYoung) > 0 && !redo[id] // once
		}
		if len(again) > 0 {
			log.Debug("dead container(s) still look live; asking again", "attempt", attempts, "containers", len(again),
				"truth_unknown", liveErr != nil, "retry_in", h.retries[waits])
			nudged, ok := h.wait(h.retries[waits], nudge)
			if !nudged {
				waits++
			}
			if !ok {
				for _, id := range again {
					d := waiting[id]
					h.report(d, logOf(d), Report{}, nil, errStopping, attempts, start, len(batch), false)
				}
				return
			}
		}
	}
}

// latestTruth holds the engines' latest answer to a decision of watch's.
type latestTruth struct {
	mu sync.Mutex
	tr engine.Truth
	ok bool
}

// set keeps tr unless it was asked before the one held: a death's
// decision narrowed from an earlier answer may end after a relist.
func (l *latestTruth) set(tr engine.Truth) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ok && tr.Asked.Before(l.tr.Asked) {
		return
	}
	l.tr, l.ok = tr, true
}

func (l *latestTruth) get() (engine.Truth, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tr, l.ok
}

// only is rep narrowed to the trees of container id.
func only(rep Report, id string) Report {
	out := rep
	out.Trees = nil
	for _, t := range rep.Trees {
		if t.ContainerID == id {
			out.Trees = append(out.Trees, t)
		}
	}
	return out
}

// report logs the outcome of one death of a burst, and counts it when
// count says so (handle counts a death still live at the end itself).
func (h *deathHandler) report(d engine.Death, log *slog.Logger, rep Report, liveErr, err error, attempts int, start time.Time, burst int, count bool) {
	latency := time.Since(d.At)
	via := d.Via
	if via == "" {
		via = "event"
	}
	attrs := []any{"attempts", attempts, "latency_ms", latency.Milliseconds(), "took_ms", time.Since(start).Milliseconds(), "burst", burst, "via", via}
	switch {
	case liveErr != nil:
		log.Error("container death not handled: ground truth unknown; nothing touched", append(attrs, "err", liveErr)...)
		return
	case errors.Is(err, errStopping):
		log.Info("container death left for the next start: watch is stopping", attrs...)
		return
	case err != nil:
		log.Error("container death not handled; the next round covers it", append(attrs, "err", err)...)
		return
	}
	logTrees(h.work, log, rep.Report)
	counts := []any{"trees", len(rep.Trees), "reaped", rep.Count(action.Reaped) + rep.Count(action.Gone),
		"would_reap", rep.Count(action.WouldReap), "would_not_die", rep.Count(action.WouldNotDie),
		"skipped_live", rep.Count(action.SkipLive), "skipped_contradicted", rep.Count(action.SkipContradicted), "dry_run", rep.DryRun}
	// Counted (and the metrics file written) before the line: a reader of
	// the line finds the file current.
	if count {
		h.tally(d, rep.Count(action.Reaped)+rep.Count(action.Gone) > 0 && !rep.DryRun)
	}
	switch {
	case rep.Refused != "":
		// The blast-radius guard: nothing was reaped, and the line says why.
		log.Error("container death handled; nothing reaped", append(append(counts, "refused", rep.Refused), attrs...)...)
	case rep.Unrecorded != nil:
		log.Error("container death handled, but reaped without recording in the ledger: the audit trail of these kills is missing", append(append(counts, "unrecorded", rep.Unrecorded), attrs...)...)
	default:
		log.Info("container death handled", append(counts, attrs...)...)
	}
}

// errStopping: watch was asked to stop before this death's turn came.
var errStopping = errors.New("watch is stopping")

// locked makes one attempt in turn with the rounds. Once watch is asked to
// stop, a death still waiting for its turn makes none: in a mass teardown
// dozens queue here, and the operator asked for the handling under way to
// finish, not for a scan and a reap per queued death after the signal.
func (h *deathHandler) locked(opt reconcile.Options, log *slog.Logger) (rep Report, liveErr, err error, took time.Duration) {
	h.serial.Lock()
	defer h.serial.Unlock()
	if h.stop.Err() != nil {
		return Report{}, nil, errStopping, 0
	}
	h.scans.Add(1)
	start := time.Now()
	rep, liveErr, err = h.attempt(h.work, opt, log)
	took = time.Since(start)
	h.w.Live.reconciled(rep)
	return rep, liveErr, err, took
}

// wait sleeps for d, or until nudged and nudgeWindow more; ok is false
// if watch is stopping.
func (h *deathHandler) wait(d time.Duration, nudge <-chan struct{}) (nudged, ok bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.stop.Done():
		return false, false
	case <-t.C:
		return false, true
	case <-nudge:
	}
	// The engine finishes a drain's containers one after the other:
	// those it finishes next join the attempt.
	t.Reset(nudgeWindow)
	select {
	case <-h.stop.Done():
		return true, false
	case <-t.C:
		return true, true
	}
}

// nudgeWindow is how long an attempt woken by a death's second report
// waits for more of them.
const nudgeWindow = 20 * time.Millisecond

// tally counts one death handled, and whether it reaped.
func (h *deathHandler) tally(d engine.Death, reaped bool) {
	h.count(d.Engine)
	h.w.Live.death(d.Engine, d.At, reaped)
}

// count records a handled death and, with --metrics-file, writes the
// counts at once: the next round may be an interval away.
func (h *deathHandler) count(eng string) {
	h.mu.Lock()
	h.handled[eng]++
	h.mu.Unlock()
	if h.w.MetricsFile == "" {
		return
	}
	ms := metrics.New()
	h.record(ms)
	if err := metrics.WriteFile(h.w.MetricsFile, ms); err != nil {
		h.log.Error("cannot write metrics", "file", h.w.MetricsFile, "err", err)
	}
}

// skip counts an event message eng's stream passed over.
func (h *deathHandler) skip(eng string) {
	h.mu.Lock()
	h.skipped[eng]++
	h.mu.Unlock()
}

// record puts the handled deaths and the skipped messages by engine into
// ms.
func (h *deathHandler) record(ms *metrics.Set) {
	if ms == nil {
		return
	}
	h.mu.Lock()
	counts, skipped := map[string]int{}, map[string]int{}
	for e := range h.followed {
		counts[e], skipped[e] = 0, 0
	}
	maps.Copy(counts, h.handled)
	maps.Copy(skipped, h.skipped)
	h.mu.Unlock()
	for _, e := range slices.Sorted(maps.Keys(counts)) {
		ms.Set(metrics.WatchDeathsHandled, float64(counts[e]), e)
	}
	for _, e := range slices.Sorted(maps.Keys(skipped)) {
		ms.Set(metrics.WatchEventsSkipped, float64(skipped[e]), e)
	}
	if h.pins != nil {
		pinned, eventsOnly := h.pins.counts()
		ms.Set(metrics.WatchContainersFollowed, float64(pinned), "pidfd")
		ms.Set(metrics.WatchContainersFollowed, float64(eventsOnly), "events")
	}
}

// redetectEvery is how often watch looks again for engines to follow: one
// that starts after watch (dockerd ordered after kc-janitor-watch at boot,
// a podman service started by hand) is followed from the next look, and
// one that had no death events is asked again.
const redetectEvery = time.Minute

// followers follows the container deaths of every engine pick returns,
// each in its own goroutine, looking again every redetectEvery.
type followers struct {
	ctx  context.Context
	h    *deathHandler
	log  *slog.Logger
	pick func() ([]engine.Engine, error)

	mu   sync.Mutex
	on   map[string]bool // followed now
	told map[string]bool // said at INFO that it reports no deaths
	wg   sync.WaitGroup
}

// look starts following every engine picked that is not followed yet. A
// late one (not in the first look) catches up once it is subscribed: its
// deaths before then were not seen.
func (f *followers) look(late bool) {
	es, err := f.pick()
	if err != nil {
		f.log.Warn("cannot look for engines to follow", "err", err)
		return
	}
	for _, e := range es {
		name := e.Name()
		f.mu.Lock()
		if f.on[name] {
			f.mu.Unlock()
			continue
		}
		f.on[name] = true
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			err := followDeaths(f.ctx, e, resubscribe(), f.log, func(resumed bool) {
				f.h.mu.Lock()
				f.h.followed[name] = true
				f.h.mu.Unlock()
				f.h.w.Live.follows(name)
				if resumed || late {
					f.h.catchUp(name)
				}
			}, f.h.death, func() { f.h.skip(name) })
			f.mu.Lock()
			delete(f.on, name)
			told := f.told[name]
			f.told[name] = true
			f.mu.Unlock()
			if err != nil {
				lvl := slog.LevelInfo // once, at the level an operator reads
				if told {
					lvl = slog.LevelDebug
				}
				msg := "engine reports no container deaths; its strays wait for the next round"
				if f.h.pins != nil {
					msg = "engine reports no container deaths; they are seen through pinned inits and the relists (every 5s)"
				}
				f.log.Log(f.ctx, lvl, msg, "engine", name, "endpoint", e.Endpoint(), "why", err, "looking_again_in", redetectEvery)
			}
		}()
	}
}

// run looks now and then every redetectEvery until ctx is done.
func (f *followers) run(every time.Duration) {
	f.look(false)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-f.ctx.Done():
				return
			case <-t.C:
				f.look(true)
			}
		}
	}()
}

// startDeathEvents follows every selected engine's container deaths and
// handles each at once; the returned stop ends that and waits for the
// handling under way. record adds the counts to a round's metrics.
func startDeathEvents(work context.Context, w *Watch, serial *sync.Mutex, log *slog.Logger) (stop func(), record func(*metrics.Set), err error) {
	log = log.With("step", "event")
	// A malformed engine setting is a usage error at once, not a warning
	// every minute.
	if _, err := w.Select(log); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(work)
	var h *deathHandler
	var pins *pinner
	// Every decision's answer: a death's question names its containers
	// alone, checked against the latest (Settings.before).
	latest := &latestTruth{}
	w.before, w.onTruth = latest.get, latest.set
	if w.Pidfd {
		store := func() *ledger.Store {
			st, err := openStore(w.StateDir, false)
			if err != nil {
				// Each round's reconcile says it; a pin goes by the engines.
				log.Debug("pinning without the ledger", "dir", w.StateDir, "err", err)
			}
			return st
		}
		pins, err = newPinner(w.Reconcile.Root, log, w.Reconcile.Containers, store, func(d engine.Death) { h.death(d) })
		if err != nil {
			log.Warn("container deaths are not seen from the kernel; engine events alone", "err", err)
		} else {
			pins.askPID = func(by listedBy, ids []string) map[string]int {
				es, err := w.Select(log)
				if err != nil {
					return nil
				}
				return askInitPIDs(ctx, es, by, ids, w.Engine.Timeout, pins.log)
			}
			// Every answer the engines give a round or a death moves the
			// pins: a restarted container's new init is pinned by the
			// first decision that sees it.
			w.onTruth = func(tr engine.Truth) {
				latest.set(tr)
				pins.refresh(tr)
			}
		}
	}
	h = newDeathHandler(*w, log, serial, work, ctx)
	h.pins = pins
	if pins != nil {
		pins.relist(ctx, pinRelist, func(ctx context.Context) (engine.Truth, error) {
			tr, err := w.Ask(ctx, log)
			if err == nil {
				latest.set(tr)
			}
			return tr, err
		})
	}
	h.attempt = func(ctx context.Context, opt reconcile.Options, log *slog.Logger) (Report, error, error) {
		s := w.Settings
		s.Reconcile = opt
		return Reconcile(ctx, s, log)
	}
	f := &followers{ctx: ctx, h: h, log: log, pick: func() ([]engine.Engine, error) { return w.Select(log) },
		on: map[string]bool{}, told: map[string]bool{}}
	if w.Events {
		f.run(redetectEvery)
	}
	stop = func() {
		cancel()
		if pins != nil {
			pins.close()
		}
		f.wg.Wait()
		h.close()
	}
	return stop, h.record, nil
}

// pinRelist is how often watch asks the engines between rounds for
// containers to pin: one started since the last answer is followed by
// events alone until then.
const pinRelist = 5 * time.Second
