package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil/containerd"
)

// Death to reap: the last phase, on the host as the largest N left it.
// For each engine, `kc-janitor watch --reconcile-apply` runs scoped with
// --container to that engine's live containers (never the whole host),
// waits until it has pinned them all, then the harness SIGKILLs each
// container's init through a pidfd (as an OOM kill or a crash ends it)
// and times from the init's death (its pidfd readable) to its tree gone:
// -deaths of them one at a time, then the rest together (the burst: from
// the last init's death to the last tree gone). --max-reap is raised to
// the containers watched: a burst larger than its default (50) is the
// blast-radius guard's to refuse, which is not what is measured here. Afterwards the engine's
// containers are dead; cleanup removes them.

// deathResult is one engine's death-to-reap figures.
type deathResult struct {
	Engine    string          `json:"engine"`
	Processes int             `json:"processes"`
	Singles   []time.Duration `json:"singles_ns"`
	Burst     int             `json:"burst"`
	// BurstKill is from the first SIGKILL to the last init dead;
	// BurstReap from the last init dead to the last tree gone.
	BurstKill time.Duration `json:"burst_kill_ns"`
	BurstReap time.Duration `json:"burst_reap_ns"`
	// BurstEngine is from the last init dead to the engine's own list
	// running none of the burst (polled through its CLI): watch must
	// wait for that answer, so it bounds BurstReap from below.
	BurstEngine time.Duration  `json:"burst_engine_ns"`
	Via         map[string]int `json:"via"` // deaths handled, by what saw them
	Scans       int            `json:"scans"`
	Load        string         `json:"load"`
}

// deathVictim is one container about to be killed.
type deathVictim struct {
	id      string
	init    int
	pidfd   int
	members []fingerprint.Stat
	// memberFDs are pidfds of the members: the harness waits for the
	// tree's end in poll(2), taking no CPU from what it times.
	memberFDs []int
}

// initPIDs asks engine e for the init PIDs of ids.
func (b *bench) initPIDs(e string, ids []string) (map[string]int, error) {
	out := map[string]int{}
	switch e {
	case "podman", "docker":
		var text string
		var err error
		args := append([]string{"inspect", "--format", "{{.Id}} {{.State.Pid}}"}, ids...)
		if e == "podman" {
			text, err = b.pm.run(time.Minute, args...)
		} else {
			text, err = b.docker.run(time.Minute, args...)
		}
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(text, "\n") {
			if id, pid, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
				out[id], _ = strconv.Atoi(pid)
			}
		}
	case "containerd":
		var err error
		if out, err = b.initPIDsRunning(); err != nil {
			return nil, err
		}
	}
	for _, id := range ids {
		if out[id] <= 0 {
			return nil, fmt.Errorf("%s: no init PID for %.12s", e, id)
		}
	}
	return out, nil
}

// initPIDsRunning is the init PID of each task containerd calls running
// in the harness's namespace.
func (b *bench) initPIDsRunning() (map[string]int, error) {
	text, err := containerdtest.TryCtr(b.ctrd.addr, b.ctrd.ns, nil, "tasks", "ls")
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[2] == "RUNNING" {
			out[f[0]], _ = strconv.Atoi(f[1])
		}
	}
	return out, nil
}

// waitNotRunning polls e's list until it runs none of vs and returns
// when it saw that, or the zero time after timeout. Docker is asked over
// its socket; podman and containerd through their CLIs (tens of
// milliseconds a poll, which is then the figure's resolution).
func (b *bench) waitNotRunning(e string, vs []*deathVictim, timeout time.Duration) time.Time {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		running, err := b.running(e)
		now := time.Now()
		if err == nil && !slices.ContainsFunc(vs, func(v *deathVictim) bool { return running[v.id] }) {
			return now
		}
		if e == "docker" {
			time.Sleep(25 * time.Millisecond) // each costs dockerd a listing
		} else {
			time.Sleep(100 * time.Millisecond) // a CLI run costs the CPU watch needs
		}
	}
	return time.Time{}
}

// running lists the containers engine e calls running.
func (b *bench) running(e string) (map[string]bool, error) {
	out := map[string]bool{}
	var text string
	var err error
	switch e {
	case "podman":
		text, err = b.pm.run(time.Minute, "ps", "-q", "--no-trunc")
	case "docker":
		return b.docker.runningAPI()
	case "containerd":
		pids, lerr := b.initPIDsRunning()
		for id := range pids {
			out[id] = true
		}
		return out, lerr
	}
	if err != nil {
		return nil, err
	}
	for _, id := range strings.Fields(text) {
		out[id] = true
	}
	return out, nil
}

// deathBench measures death to reap for every engine with containers.
func (b *bench) deathBench() {
	engines := map[string]string{"docker": "docker", "containerd": "containerd"}
	if b.pm != nil {
		engines["podman"] = "api"
	}
	for _, e := range []string{"podman", "docker", "containerd"} {
		path, ok := engines[e]
		if !ok || len(b.liveFor(path)) == 0 {
			continue
		}
		// One engine's failure leaves the others' figures.
		if err := b.deathsOf(e, path); err != nil {
			b.fail("death to reap, %s: %v", e, err)
		}
	}
}

func (b *bench) deathsOf(e, path string) error {
	ids := b.liveFor(path)
	pids, err := b.initPIDs(e, ids)
	if err != nil {
		return err
	}
	leaders := map[string]int{}
	for _, p := range b.planted {
		leaders[p.ContainerID] = p.PGID
	}
	victims := make([]*deathVictim, 0, len(ids))
	defer func() {
		for _, v := range victims {
			if v.pidfd >= 0 {
				unix.Close(v.pidfd)
			}
			for _, fd := range v.memberFDs {
				unix.Close(fd)
			}
		}
	}()
	for _, id := range ids {
		v := &deathVictim{id: id, init: pids[id], pidfd: -1, members: groupMembers(leaders[id])}
		if len(v.members) == 0 {
			return fmt.Errorf("the tree of %.12s has no members", id)
		}
		victims = append(victims, v)
		if v.pidfd, err = unix.PidfdOpen(v.init, 0); err != nil {
			return fmt.Errorf("pidfd_open of %.12s's init %d: %w", id, v.init, err)
		}
		for _, m := range v.members {
			fd, err := unix.PidfdOpen(m.PID, 0)
			if err != nil {
				return fmt.Errorf("pidfd_open of %.12s's tree member %d: %w", id, m.PID, err)
			}
			v.memberFDs = append(v.memberFDs, fd)
			// Opened after the listing: the PID must still be the member's.
			if st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, m.PID); err != nil || st.StartTicks != m.StartTicks {
				return fmt.Errorf("%.12s's tree member %d changed before the kills", id, m.PID)
			}
		}
		// The tree's wrapper is the harness's child: reaped on exit, as a
		// real supervisor's parent does.
		pop.reapOnExitPID(leaders[id])
	}
	dir := filepath.Join(b.tmp, "watch-"+e)
	for _, d := range []string{"state", "sockets"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	logPath := filepath.Join(dir, "watch.log")
	argv := []string{b.janitor, "watch", "--interval", "1h", "--no-cull", "--reconcile-apply", "--min-age", "0s",
		"--kill-grace", "500ms", "--max-reap", strconv.Itoa(len(ids) + 1), "--state-dir", filepath.Join(dir, "state"), "--socket-dir", filepath.Join(dir, "sockets"),
		"--log-level", "debug", "--log-format", "json", "--log-file", logPath, "--metrics-file", filepath.Join(dir, "watch.prom")}
	argv = append(argv, b.janArgs[path]...)
	for _, id := range ids {
		argv = append(argv, "--container", id)
	}
	w, err := pop.start("watch-"+e, argv, b.janEnv, newGroup)
	if err != nil {
		return err
	}
	defer pop.reap(w)
	progress("death to reap, %s: watch pinning %d containers", e, len(ids))
	if _, err := waitLog(logPath, time.Minute, func(l map[string]any) bool { return l["msg"] == "reconcile" && l["step"] == "reconcile" }); err != nil {
		return fmt.Errorf("watch's first round: %w (%s)", err, w.logTail())
	}
	if _, err := waitLog(logPath, time.Minute, func(l map[string]any) bool {
		return l["msg"] == "live containers pinned" && l["pinned"] == float64(len(ids))
	}); err != nil {
		return fmt.Errorf("watch did not pin every container: %w (%s)", err, w.logTail())
	}
	// The metrics file is written once the start-up round is over: its
	// sweep looks into every container, and on 2 vCPUs deaths timed
	// during it measured the sweep.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "watch.prom")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("watch's start-up round did not end within a minute (%s)", w.logTail())
		}
	}

	dr := deathResult{Engine: e, Processes: countProcesses(), Via: map[string]int{}}
	singles := min(b.cfg.deaths, len(victims))
	for _, v := range victims[:singles] {
		died, err := killInits([]*deathVictim{v})
		if err != nil {
			return err
		}
		gone, err := waitTreesGone([]*deathVictim{v}, 20*time.Second)
		if err != nil {
			return err
		}
		dr.Singles = append(dr.Singles, gone.Sub(died[0]))
	}
	if burst := victims[singles:]; len(burst) > 0 {
		start := time.Now()
		died, err := killInits(burst)
		if err != nil {
			return err
		}
		last := slices.MaxFunc(died, func(a, b time.Time) int { return a.Compare(b) })
		dr.Burst, dr.BurstKill = len(burst), last.Sub(start)
		engineDone := make(chan time.Time, 1)
		go func() { engineDone <- b.waitNotRunning(e, burst, 30*time.Second) }()
		gone, err := waitTreesGone(burst, 30*time.Second)
		if at := <-engineDone; at.IsZero() {
			dr.BurstEngine = -1
		} else {
			dr.BurstEngine = at.Sub(last)
		}
		if err != nil {
			// The singles' figures stand; the burst's is the failure.
			dr.BurstReap = -1
			dr.Load = loadavg()
			b.res.Deaths = append(b.res.Deaths, dr)
			return err
		}
		dr.BurstReap = gone.Sub(last)
	}
	// Every death's line (written after the reap), and the scans they took.
	handled := map[string]bool{}
	var lines []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines, _ = readLog(logPath)
		n := 0
		for _, l := range lines {
			if id, _ := l["container"].(string); l["msg"] == "container death handled" && slices.Contains(ids, id) {
				n++
			}
		}
		if n >= len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range lines {
		switch {
		case l["msg"] == "container death handled":
			id, _ := l["container"].(string)
			if !handled[id] {
				handled[id] = true
				via, _ := l["via"].(string)
				if via == "" {
					via = "event"
				}
				dr.Via[via]++
			}
		case l["msg"] == "scanned" && l["step"] == "event":
			dr.Scans++
		}
	}
	dr.Load = loadavg()
	b.res.Deaths = append(b.res.Deaths, dr)
	p50, p95 := percentile(dr.Singles, 50), percentile(dr.Singles, 95)
	progress("death to reap, %s: p50 %v, p95 %v over %d; burst of %d: all dead %v after the first kill, all trees gone %v after the last death; via %v, %d scans; load %s",
		e, p50, p95, len(dr.Singles), dr.Burst, dr.BurstKill.Round(time.Millisecond), dr.BurstReap.Round(time.Millisecond), viaText(dr.Via), dr.Scans, dr.Load)
	return nil
}

// killInits SIGKILLs each victim's init through its pidfd and returns the
// moments each pidfd became readable (the init dead).
func killInits(vs []*deathVictim) ([]time.Time, error) {
	for _, v := range vs {
		if err := unix.PidfdSendSignal(v.pidfd, unix.SIGKILL, nil, 0); err != nil {
			return nil, fmt.Errorf("killing %.12s's init: %w", v.id, err)
		}
	}
	fds := make([]int, len(vs))
	for i, v := range vs {
		fds[i] = v.pidfd
	}
	died, err := waitReadable(fds, 20*time.Second)
	if err != nil {
		return nil, fmt.Errorf("inits after SIGKILL: %w", err)
	}
	return died, nil
}

// waitReadable waits until each pidfd is readable (its process exited)
// and returns when each became so.
func waitReadable(pidfds []int, within time.Duration) ([]time.Time, error) {
	at := make([]time.Time, len(pidfds))
	fds := make([]unix.PollFd, len(pidfds))
	for i, fd := range pidfds {
		fds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	left := len(fds)
	deadline := time.Now().Add(within)
	for left > 0 {
		n, err := unix.Poll(fds, 100)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		now := time.Now()
		for i := range fds {
			if n > 0 && fds[i].Revents != 0 && fds[i].Fd >= 0 {
				at[i] = now
				fds[i].Fd = -1 // poll skips negative fds
				left--
			}
		}
		if left > 0 && now.After(deadline) {
			return nil, fmt.Errorf("%d processes still alive after %v", left, within)
		}
	}
	return at, nil
}

// waitTreesGone waits until every member of every victim's tree has
// exited and returns that moment.
func waitTreesGone(vs []*deathVictim, within time.Duration) (time.Time, error) {
	var fds []int
	for _, v := range vs {
		fds = append(fds, v.memberFDs...)
	}
	at, err := waitReadable(fds, within)
	if err != nil {
		return time.Time{}, fmt.Errorf("trees of %d containers after their deaths: %w", len(vs), err)
	}
	return slices.MaxFunc(at, func(a, b time.Time) int { return a.Compare(b) }), nil
}

// readLog parses a JSON log file's lines.
func readLog(path string) ([]map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out, nil
}

// waitLog polls path until a line matches.
func waitLog(path string, within time.Duration, match func(map[string]any) bool) (map[string]any, error) {
	deadline := time.Now().Add(within)
	for {
		lines, _ := readLog(path)
		for _, l := range lines {
			if match(l) {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no such line in %s after %v", path, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// viaText is "pidfd 5, event 2".
func viaText(via map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(via)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, via[k]))
	}
	return strings.Join(parts, ", ")
}

// percentile is the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(i-1, 0)]
}

// deathTable prints the death-to-reap figures.
func (b *bench) deathTable(w io.Writer) {
	if len(b.res.Deaths) == 0 {
		return
	}
	fmt.Fprintf(w, "### death to reap (`watch --reconcile-apply` scoped to the engine's containers; each init SIGKILLed through a pidfd; from the init's death to its tree gone)\n\n")
	fmt.Fprintln(w, "| engine | processes | p50 | p95 | deaths | burst | burst: kills → last init dead | burst: last death → all trees gone | burst: last death → the engine's list runs none | deaths seen via | scans | load after |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, d := range b.res.Deaths {
		reap := ms(d.BurstReap)
		if d.BurstReap < 0 {
			reap = "not all within 30 s"
		}
		eng := ms(d.BurstEngine)
		if d.BurstEngine < 0 {
			eng = "not within 30 s"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %d | %s | %s | %s | %v | %d | %s |\n", d.Engine, d.Processes, ms(percentile(d.Singles, 50)), ms(percentile(d.Singles, 95)),
			len(d.Singles), d.Burst, ms(d.BurstKill), reap, eng, viaText(d.Via), d.Scans, d.Load)
	}
	fmt.Fprintln(w)
}

// deathTargets: p50 < 100 ms, p95 < 200 ms per engine; a burst of 100
// reaped within 2 s of the last death.
func (b *bench) deathTargets() {
	for _, d := range b.res.Deaths {
		if len(d.Singles) > 0 {
			p50, p95 := percentile(d.Singles, 50), percentile(d.Singles, 95)
			b.res.Targets = append(b.res.Targets, target{What: fmt.Sprintf("%s: init death → tree gone, %d deaths at %d processes", d.Engine, len(d.Singles), d.Processes),
				Goal: "p50 < 100 ms, p95 < 200 ms", Measured: fmt.Sprintf("p50 %s, p95 %s", ms(p50), ms(p95)), Met: p50 < 100*time.Millisecond && p95 < 200*time.Millisecond})
		}
		if d.Burst > 0 && d.BurstReap < 0 {
			b.res.Targets = append(b.res.Targets, target{What: fmt.Sprintf("%s: burst of %d deaths, last death → all trees gone", d.Engine, d.Burst),
				Goal: "≤ 2 s (for 100)", Measured: "not all within 30 s", Met: false})
		} else if d.Burst > 0 {
			t := target{What: fmt.Sprintf("%s: burst of %d deaths, last death → all trees gone", d.Engine, d.Burst),
				Goal: "≤ 2 s (for 100)", Measured: fmt.Sprintf("%s (%d scans; the engine's own list ran none after %s)", ms(d.BurstReap), d.Scans, ms(d.BurstEngine)), Met: d.BurstReap <= 2*time.Second}
			if d.Burst < 100 {
				t.Comparison, t.Goal = true, "— (fewer than 100: -containers)"
			}
			b.res.Targets = append(b.res.Targets, t)
		}
	}
}
