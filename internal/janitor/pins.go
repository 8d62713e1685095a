package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/corroborate"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
)

// Why a container's init is not pinned (DESIGN "Engines"): each one leaves the
// container to the engines' events and the relists.
var (
	// errInitDead: pidfd_open said ESRCH, or the process is a zombie, and
	// the process was the init (recorded, or checked): the container died
	// before it could be pinned, and is decided at once.
	errInitDead = errors.New("the init has already exited")
	// errInitUnseen: no process holds the PID an engine gave, and nothing
	// recorded it: the init may have exited, or the PID be of another PID
	// namespace.
	errInitUnseen    = errors.New("no process here holds the PID the engine gave (exited, or a PID of the engine's own PID namespace)")
	errStartMismatch = errors.New("the process's start time is not the init's")
	errNotItsCgroup  = errors.New("the process is not in the container's cgroup")
	errNotPIDNSInit  = errors.New("the process is not PID 1 of a PID namespace right below ours")
	errSharedPID     = errors.New("one host PID stands for several containers")
)

// pinInit opens a pidfd for container id's init at host PID pid and checks
// it is that init: started at wantStart (the ledger's record; 0 when there
// is none), in a cgroup carrying the container's ID, PID 1 of a PID
// namespace right below ours. Only such a process, once gone, is a death
// (errInitDead).
//
// Without a record nothing vouches for the PID: an engine in another PID
// namespace (Docker in Docker, a kind node's containerd) answers PIDs of
// its own, which here are nobody's or a stranger's. The process holding
// the PID is then checked before it is taken for the init (between two
// reads of its start time, so that the check is of that process), and a
// PID nobody holds is errInitUnseen, not a death: the container is left
// to the engines' events.
func pinInit(root, id string, pid int, wantStart uint64) (*fingerprint.Pinned, error) {
	if wantStart == 0 {
		st, err := fingerprint.ReadStat(root, pid)
		if errors.Is(err, fingerprint.ErrNotFound) {
			return nil, fmt.Errorf("pid %d: %w", pid, errInitUnseen)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the init's start time: %w", err)
		}
		if err := checkInit(root, id, pid); err != nil {
			return nil, err
		}
		if again, err := fingerprint.ReadStat(root, pid); err != nil || again.StartTicks != st.StartTicks {
			return nil, fmt.Errorf("pid %d: gone or replaced while checked: %w", pid, errInitUnseen)
		}
		wantStart = st.StartTicks
	}
	p, err := fingerprint.Pin(root, fingerprint.Stat{PID: pid, StartTicks: wantStart})
	switch {
	case errors.Is(err, fingerprint.ErrNotFound):
		return nil, fmt.Errorf("pid %d: %w", pid, errInitDead)
	case errors.Is(err, fingerprint.ErrRecycled):
		return nil, fmt.Errorf("%w: %w", errStartMismatch, err)
	case err != nil:
		return nil, err
	}
	// Read after pidfd_open: the pidfd is the process whose start time was
	// just checked, and if it dies now the pidfd tells.
	if err := checkInit(root, id, pid); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// checkInit checks pid's cgroup names container id and pid is PID 1 of a
// PID namespace right below ours (NSpid: its PID here, then 1). A sandbox
// nested in the container (a browser's zygote, bwrap) is PID 1 of a
// namespace below the container's, in its cgroup; taken for the init, its
// exit would read as the container's death.
func checkInit(root, id string, pid int) error {
	in, err := inItsCgroup(root, id, pid)
	if err != nil {
		return err
	}
	if !in {
		return fmt.Errorf("pid %d: %w", pid, errNotItsCgroup)
	}
	return pidNSInit(root, pid)
}

// MayBeInit reports why pid cannot be container id's init, or nil: it
// may be when its cgroup is named after the container, or when it is PID
// 1 of a PID namespace right below ours, a container monitor's child
// (conmon, containerd-shim*), in no cgroup named after another
// container. Looser than a pin's check (both): a sweep's target only
// needs the PID an engine gave to still be the container's process, and
// a --pid=host or a cgroup-less container's init passes by one of the
// two, where a PID reused since the answer (a user's unshare(1), another
// container's init) passes by neither.
func MayBeInit(root, id string, pid int) error {
	dir := filepath.Join(root, strconv.Itoa(pid))
	cg, err := fingerprint.ReadCapped(filepath.Join(dir, "cgroup"))
	if err != nil {
		return fmt.Errorf("reading its cgroup: %w", err)
	}
	switch {
	case corroborate.InContainerCgroup(cg, id):
		return nil
	case corroborate.OtherContainerCgroup(cg, id):
		return fmt.Errorf("%w: it is in another container's", errNotItsCgroup)
	}
	if err := pidNSInit(root, pid); err != nil {
		return fmt.Errorf("%w, nor in its cgroup", err)
	}
	st, err := fingerprint.ReadStat(root, pid)
	if err != nil {
		return err
	}
	parent, err := fingerprint.ReadStat(root, st.PPID)
	if err != nil || !corroborate.IsMonitor(parent.Comm) {
		return fmt.Errorf("pid %d: not in its cgroup, and a PID namespace's init whose parent (%d %q) is no container monitor", pid, st.PPID, parent.Comm)
	}
	return nil
}

// inItsCgroup reports whether pid's cgroup is named after container id.
func inItsCgroup(root, id string, pid int) (bool, error) {
	cg, err := fingerprint.ReadCapped(filepath.Join(root, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false, fmt.Errorf("reading the init's cgroup: %w", err)
	}
	return corroborate.InContainerCgroup(cg, id), nil
}

// pidNSInit checks pid is PID 1 of a PID namespace right below ours.
func pidNSInit(root string, pid int) error {
	status, err := fingerprint.ReadCapped(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return fmt.Errorf("reading the init's status: %w", err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f, ok := strings.CutPrefix(l, "NSpid:"); ok {
			ns := strings.Fields(f)
			if len(ns) == 2 && ns[0] == strconv.Itoa(pid) && ns[1] == "1" {
				return nil
			}
			return fmt.Errorf("pid %d: NSpid %v: %w", pid, ns, errNotPIDNSInit)
		}
	}
	return fmt.Errorf("pid %d: no NSpid line: %w", pid, errNotPIDNSInit)
}

// pin is one container's init held through a pidfd.
type pin struct {
	id, engine string
	p          *fingerprint.Pinned
	key        int32
}

// pinner holds a pidfd for every live container's init it can pin and
// reports a container dead the moment its pidfd becomes readable, whatever
// the engine's event backend does (DESIGN "Engines"). The pins follow each
// answer the engines give (every round, every death handled, every
// relist).
type pinner struct {
	root  string
	log   *slog.Logger
	death func(engine.Death)
	scope map[string]bool
	store func() *ledger.Store
	// max keeps the pidfds under the file limit; containers past it are
	// followed by events and relists.
	max int
	// askPID, when set, asks the engine of an answer for the init PIDs
	// of ids its list gave none for (Docker's inspect, askInitPIDs); an
	// ID left out has none.
	askPID func(by listedBy, ids []string) map[string]int

	mu      sync.Mutex
	closed  bool
	epfd    int
	wake    int // an eventfd that ends the poll loop
	pins    map[string]*pin
	byKey   map[int32]*pin
	nextKey int32
	refused map[string]int // the PID refused for each container, said once
	// deadInit is the dead init PID reported for each container an
	// answer still lists live: an engine that has not caught up lists it
	// so at every answer, and each report would be decided anew.
	deadInit map[string]int
	// diedAt is when each container's pin reported its init dead.
	diedAt map[string]time.Time
	// asking: askPID is under way in the background.
	asking bool
	// eventsOnly is the live containers the last refresh left unpinned.
	eventsOnly int
	// unpinned is each of those: its death is seen by the next answer
	// that no longer lists it, if no event said it before.
	unpinned map[string]unpinnedLive
	// listed is how many live containers each engine's last answer
	// listed, to tell a death from a list gone wrong.
	listed map[listedBy]int
	// doubted are the containers an answer dropped too many of at once:
	// reported if the next answer of their engine does not list them
	// either.
	doubted map[string]unpinnedLive
	// newest is when the newest answer applied was asked: an older one
	// (a round's, applied after its scan, behind a relist's), or one of
	// its time again (a death's question narrowed from it: AskAbout keeps
	// the older time), moves no pin away and says no container went.
	newest time.Time
	said   [2]int
	wg     sync.WaitGroup
}

func newPinner(root string, log *slog.Logger, scope map[string]bool, store func() *ledger.Store, death func(engine.Death)) (*pinner, error) {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll for pidfds: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd for pidfds: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return nil, fmt.Errorf("epoll for pidfds: %w", err)
	}
	max := 512
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur > 0 {
		max = int(min(rl.Cur/2, 1<<20))
	}
	p := &pinner{root: root, log: log.With("step", "pidfd"), death: death, scope: scope, store: store, max: max,
		epfd: epfd, wake: wake, pins: map[string]*pin{}, byKey: map[int32]*pin{}, refused: map[string]int{}, deadInit: map[string]int{}, diedAt: map[string]time.Time{}, unpinned: map[string]unpinnedLive{}, listed: map[listedBy]int{}, doubted: map[string]unpinnedLive{}}
	p.wg.Add(1)
	go p.loop()
	return p, nil
}

// loop waits for pidfds to become readable: each is a container's death.
func (p *pinner) loop() {
	defer p.wg.Done()
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(p.epfd, evs, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			p.log.Error("waiting on pidfds failed; deaths are followed by events alone", "err", err)
			return
		}
		now := time.Now()
		var dead []*pin
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		for _, ev := range evs[:n] {
			// Keys, not fd numbers: a pidfd closed by a refresh while its
			// event was in flight may have its number reused already.
			if pn, ok := p.byKey[ev.Fd]; ok {
				p.drop(pn)
				p.diedAt[pn.id] = now
				// An answer that still lists it with this PID tells
				// the same death: not reported again.
				p.deadInit[pn.id] = pn.p.PID
				dead = append(dead, pn)
			}
		}
		p.mu.Unlock()
		for _, pn := range dead {
			p.log.Debug("container init exited", "container", pn.id, "engine", pn.engine, "pid", pn.p.PID)
			p.death(engine.Death{Engine: pn.engine, ID: pn.id, At: now, Via: "pidfd", PID: pn.p.PID})
		}
	}
}

// died is told of every death reported for id, by any source: a
// container whose init could not be pinned is asked again once its next
// init may run (a restart), rather than followed by events for its life.
// Docker's list names no init, so without this a container refused once
// (its init exited between inspect and the pin: a crash loop's) was never
// pinned again while its engine kept it live.
func (p *pinner) died(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.refused[id]; ok {
		delete(p.refused, id)
		p.diedAt[id] = time.Now()
	}
}

// drop forgets pn and closes its pidfd; p.mu is held.
func (p *pinner) drop(pn *pin) {
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, pn.p.Fd(), nil)
	pn.p.Close()
	delete(p.pins, pn.id)
	delete(p.byKey, pn.key)
}

// refresh pins the live containers of the engines' answers not pinned yet,
// re-pins those whose init changed (a restart) and lets go of the rest.
// A container that died before it could be pinned is reported dead now.
// An engine whose list gives no init PID (Docker's) is asked each new
// container's (askPID) in the background, never on a decision's path, and
// without an answer the ledger's record of it is used; either is
// validated like any other before it is pinned.
func (p *pinner) refresh(tr engine.Truth) { p.apply(tr.Answers, tr.Asked, nil) }

// apply is refresh of answers asked at asked; told, when not nil, is
// askPID's answers for the containers the engines listed without an
// init PID.
func (p *pinner) apply(answers []engine.Answer, asked time.Time, told map[listedBy]map[string]int) {
	type want struct {
		engine string
		pid    int
		// ledger: the PID is the hook's record, not the engine's word;
		// a dead one then says nothing of the container (a restart).
		ledger bool
	}
	wants := map[string]want{}
	live := map[string]bool{}
	// Live containers whose engine gave no init PID, and the answer.
	noPID := map[string]listedBy{}
	listers := engine.Listers(answers)
	for _, a := range answers {
		for _, c := range a.Containers {
			if !c.Live || (len(p.scope) > 0 && !p.scope[c.ID]) {
				continue
			}
			live[c.ID] = true
			if c.InitPID > 0 && !engine.PIDFrom(listers, a, c.ID) {
				continue // a user's word on a container root's engine lists too
			}
			if c.InitPID <= 0 {
				if _, ok := noPID[c.ID]; !ok {
					noPID[c.ID] = listedIn(a)
				}
				continue
			}
			if _, dup := wants[c.ID]; dup {
				continue // the same container through two engines (Docker's in moby)
			}
			wants[c.ID] = want{engine: a.Engine, pid: c.InitPID}
		}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	// A pinned container keeps its pin while its engine lists it live: a
	// restart kills the init, which the pidfd reports.
	ask := map[listedBy][]string{}
	for id, by := range noPID {
		if _, ok := wants[id]; ok {
			continue
		}
		if pn, ok := p.pins[id]; ok {
			wants[id] = want{engine: by.engine, pid: pn.p.PID}
			continue
		}
		if _, ok := p.refused[id]; ok {
			continue
		}
		// Its init just died and the engine still lists it: asking now
		// would name the dead init. A restart is pinned by a later answer.
		if at, ok := p.diedAt[id]; ok && time.Since(at) < pinRelist {
			continue
		}
		ask[by] = append(ask[by], id)
	}
	for id, at := range p.diedAt {
		if time.Since(at) >= pinRelist {
			delete(p.diedAt, id)
		}
	}
	later := told == nil && p.askPID != nil && len(ask) > 0
	if later && !p.asking {
		p.asking = true
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			got := map[listedBy]map[string]int{}
			for by, ids := range ask {
				got[by] = p.askPID(by, ids)
			}
			p.apply(answers, asked, got)
			p.mu.Lock()
			p.asking = false
			p.mu.Unlock()
		}()
	}
	p.mu.Unlock()
	var st *ledger.Store
	for by, ids := range ask {
		if later {
			break
		}
		for _, id := range ids {
			pid, ok := told[by][id]
			switch {
			case pid > 0:
				wants[id] = want{engine: by.engine, pid: pid}
			case !ok:
				if st == nil && p.store != nil {
					st = p.store()
				}
				if pid = recordedPID(st, id); pid > 0 {
					wants[id] = want{engine: by.engine, pid: pid, ledger: true}
				}
			}
		}
	}
	byPID := map[int]int{}
	for _, w := range wants {
		byPID[w.pid]++
	}
	var dead []engine.Death
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	fresh := told == nil && asked.After(p.newest)
	if fresh {
		p.newest = asked
		dead = p.goneUnpinned(answers, live)
	}
	for id, pn := range p.pins {
		// The background pass and an older answer only add: they may
		// be older than a pin made since.
		if !fresh {
			break
		}
		if w, ok := wants[id]; !ok || w.pid != pn.p.PID || byPID[w.pid] > 1 {
			if pn.p.Exited() {
				dead = append(dead, engine.Death{Engine: pn.engine, ID: id, At: time.Now(), Via: "pidfd", PID: pn.p.PID})
				p.diedAt[id] = time.Now()
				p.deadInit[id] = pn.p.PID
			}
			p.drop(pn)
		}
	}
	eventsOnly := 0
	for id, w := range wants {
		if _, ok := p.pins[id]; ok {
			continue
		}
		_, asked := noPID[id]
		if pid, ok := p.refused[id]; ok && (pid == w.pid || asked) {
			eventsOnly++
			continue
		}
		log := p.log.With("container", id, "engine", w.engine, "pid", w.pid)
		if byPID[w.pid] > 1 {
			p.refused[id] = w.pid
			eventsOnly++
			log.Info("container init not pinned; its death is followed by events and relists", "why", errSharedPID)
			continue
		}
		if len(p.pins) >= p.max {
			eventsOnly++
			continue
		}
		if st == nil && p.store != nil {
			st = p.store()
		}
		pn, err := pinInit(p.root, id, w.pid, recordedStart(st, id, w.pid))
		if errors.Is(err, errInitDead) && !w.ledger {
			if p.deadInit[id] != w.pid {
				p.deadInit[id] = w.pid
				dead = append(dead, engine.Death{Engine: w.engine, ID: id, At: time.Now(), Via: "pidfd", PID: w.pid})
			}
			continue
		}
		if err != nil {
			p.refused[id] = w.pid
			eventsOnly++
			log.Info("container init not pinned; its death is followed by events and relists", "why", err)
			continue
		}
		p.nextKey++
		if p.nextKey < 0 {
			p.nextKey = 0
		}
		np := &pin{id: id, engine: w.engine, p: pn, key: p.nextKey}
		if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, pn.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: np.key}); err != nil {
			pn.Close()
			eventsOnly++
			log.Warn("container init not pinned; its death is followed by events and relists", "why", fmt.Errorf("epoll: %w", err))
			continue
		}
		p.pins[id], p.byKey[np.key] = np, np
		delete(p.unpinned, id)
	}
	for id := range p.refused {
		if fresh && !live[id] {
			delete(p.refused, id)
		}
	}
	for id := range p.deadInit {
		if fresh && !live[id] {
			delete(p.deadInit, id)
		}
	}
	for id := range noPID {
		if _, ok := wants[id]; !ok {
			eventsOnly++
		}
	}
	if fresh {
		p.noteUnpinned(answers, asked)
	}
	pinned := len(p.pins)
	changed := false
	// The background pass counts for its answer; an older answer than one
	// applied does not.
	if !later && (told != nil || fresh) {
		p.eventsOnly = eventsOnly
		changed = p.said != [2]int{pinned, eventsOnly}
		p.said = [2]int{pinned, eventsOnly}
	}
	p.mu.Unlock()
	if changed {
		p.log.Info("live containers pinned", "pinned", pinned, "events_only", eventsOnly, "max_pins", p.max)
	}
	for _, d := range dead {
		p.death(d)
	}
}

// unpinnedLive is a live container an answer listed and no pin holds.
type unpinnedLive struct {
	by listedBy
	// at is when the engines were asked: it was live then.
	at time.Time
}

// goneUnpinned reports the containers the last refresh left unpinned that
// the same engine no longer lists live: a death no event may ever tell
// (CRI without events, podman's CLI), seen within pinRelist rather than
// at the next round. It is dated to when they were last listed live, so
// that nothing started since is judged by it; an event that came first
// coalesces it (settledDeath). An answer that drops more than half of
// what its engine listed live (from 3) may be a list gone wrong: those
// are reported only if the engine's next answer does not list them
// either. p.mu is held.
func (p *pinner) goneUnpinned(answers []engine.Answer, live map[string]bool) []engine.Death {
	answered := map[listedBy]bool{}
	for _, a := range answers {
		answered[listedIn(a)] = true
	}
	var dead []engine.Death
	for id, u := range p.doubted {
		if _, pinned := p.pins[id]; !live[id] && !pinned && answered[u.by] {
			dead = append(dead, engine.Death{Engine: u.by.engine, ID: id, At: u.at, Via: "relist"})
		}
	}
	clear(p.doubted)
	gone := map[listedBy][]engine.Death{}
	for id, u := range p.unpinned {
		if _, pinned := p.pins[id]; live[id] || pinned || !answered[u.by] {
			continue
		}
		gone[u.by] = append(gone[u.by], engine.Death{Engine: u.by.engine, ID: id, At: u.at, Via: "relist"})
	}
	for by, ds := range gone {
		if n := p.listed[by]; len(ds) >= 3 && 2*len(ds) > n {
			p.log.Warn("an answer no longer lists more than half of its engine's live containers; their deaths wait for its next answer",
				"engine", by.engine, "endpoint", by.endpoint, "gone", len(ds), "listed_before", n)
			for _, d := range ds {
				p.doubted[d.ID] = unpinnedLive{by: by, at: d.At}
			}
			continue
		}
		dead = append(dead, ds...)
	}
	return dead
}

// noteUnpinned remembers the live containers answers (asked at asked)
// listed that no pin holds now, but those whose init just died: their
// engine lists them until it catches up, and that is no later death.
// p.mu is held.
func (p *pinner) noteUnpinned(answers []engine.Answer, asked time.Time) {
	clear(p.unpinned)
	clear(p.listed)
	for _, a := range answers {
		by := listedIn(a)
		for _, c := range a.Containers {
			if !c.Live || (len(p.scope) > 0 && !p.scope[c.ID]) {
				continue
			}
			p.listed[by]++
			_, pinned := p.pins[c.ID]
			_, died := p.diedAt[c.ID]
			if _, dup := p.unpinned[c.ID]; !pinned && !died && !dup {
				p.unpinned[c.ID] = unpinnedLive{by: by, at: asked}
			}
		}
	}
}

// counts says how many live containers the last refresh pinned and how
// many it left to the engines' events and the relists.
func (p *pinner) counts() (pinned, eventsOnly int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pins), p.eventsOnly
}

// recordedStart is the start time the hook recorded for id's init at
// pid in this boot, or 0.
func recordedStart(st *ledger.Store, id string, pid int) uint64 {
	if st == nil {
		return 0
	}
	r, err := st.Load(id)
	if err != nil || r == nil || r.Init == nil || r.Init.PID != pid || !st.Current(r) {
		return 0
	}
	return r.Init.StartTicks
}

// listedBy is the engine answer that listed a container live without its
// init PID: the engine, its endpoint, and the UID of the peer that
// answered, whom the init PID must come from too.
type listedBy struct {
	engine, endpoint string
	uid              int
}

func listedIn(a engine.Answer) listedBy { return listedBy{a.Engine, a.Endpoint, a.UID} }

// askInitPIDs asks the engine by names among es (that endpoint's) for the
// init PIDs of ids (Docker's inspect), a few at a time, within timeout
// (0: the engines' default). An ID whose answer failed is left out, and
// so is one answered by a peer other than the list's; one not running
// is 0.
func askInitPIDs(ctx context.Context, es []engine.Engine, by listedBy, ids []string, timeout time.Duration, log *slog.Logger) map[string]int {
	eng := by.engine
	var asker engine.InitPIDAsker
	for _, e := range es {
		if a, ok := e.(engine.InitPIDAsker); ok && e.Name() == by.engine && e.Endpoint() == by.endpoint {
			asker = a
		}
	}
	out := map[string]int{}
	if asker == nil {
		return out
	}
	if timeout <= 0 {
		timeout = engine.DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan string)
	for range min(4, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				pid, uid, err := asker.InitPID(ctx, id)
				if err != nil {
					log.Debug("init PID not known; the container is followed by events and relists", "container", id, "engine", eng, "err", err)
					continue
				}
				if uid < 0 || uid != by.uid {
					log.Warn("init PID answered by a peer other than the one that listed the container; ignored", "container", id, "engine", eng, "uid", uid, "list_uid", by.uid)
					continue
				}
				mu.Lock()
				out[id] = pid
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out
}

// recordedPID is the init PID the hook recorded for id in this boot, or 0.
func recordedPID(st *ledger.Store, id string) int {
	if st == nil {
		return 0
	}
	r, err := st.Load(id)
	if err != nil || r == nil || r.Init == nil || !st.Current(r) {
		return 0
	}
	return r.Init.PID
}

// relist asks the engines every every until ctx is done, so that a
// container started between rounds is pinned within that time.
func (p *pinner) relist(ctx context.Context, every time.Duration, ask func(context.Context) (engine.Truth, error)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if tr, err := ask(ctx); err == nil {
				p.refresh(tr)
			}
		}
	}()
}

// close lets go of every pin and waits for the loop.
func (p *pinner) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	unix.Write(p.wake, one)
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pn := range p.pins {
		p.drop(pn)
	}
	unix.Close(p.epfd)
	unix.Close(p.wake)
}
