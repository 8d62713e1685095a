package hook

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
	"github.com/kc-watchman/kc-watchman/internal/reap"
	"github.com/kc-watchman/kc-watchman/internal/trees"
	"github.com/kc-watchman/kc-watchman/internal/userns"
)

// Config is the hook's configuration.
type Config struct {
	StateDir  string
	Comms     []string
	KillGrace time.Duration
	// Deadline bounds a whole poststop run; it must stay below the
	// descriptor's timeout.
	Deadline time.Duration
	// Until, when set, is when a pre-start stage gives up (kc-hook exits
	// 0 then, whatever is under way): a supervisor is not launched so
	// near it that the exit could land between the wrapper's start and
	// its record.
	Until time.Time
	// Root is the procfs mount; default /proc.
	Root   string
	Logger *slog.Logger
	// SupervisorsFile is the allowlist of supervisors the
	// io.kc-watchman.supervisor annotation may name (launch.go); default
	// /etc/kc-watchman/supervisors.json.
	SupervisorsFile string
	// Lister is how the scan lists processes (default: the BPF task
	// iterator where it can be used).
	Lister proctable.Lister
	// UIDs turns the UIDs /proc shows the hook into host UIDs; zero
	// value: read the hook's own map (userns.SelfTranslator). A rootless
	// podman runs the hook as root of its user namespace, so neither its
	// effective UID nor the trees' are what they are on the host.
	UIDs *userns.Translator
	// Contain finds the supervisor's cgroup the ledger names, swept at
	// poststop (and, with a systemd client, its scope stopped).
	Contain contain.Options
}

// Result is what one run did.
type Result struct {
	Trees []ledger.Tree
	// Failed is set when a tree would not die: poststop then exits 1.
	Failed bool
	// Refused are the container's trees reap would not touch although
	// they are the container's (of no single UID, or naming another
	// container too): left alive, so poststop exits 1 naming them.
	Refused []ledger.Tree
	// Unrecorded is why the outcome could not be written to the ledger,
	// when it could not: the trees were still dealt with.
	Unrecorded error
}

// Record handles the creation stages: it stamps the stage and, when the
// runtime gave one, the init process's identity. Errors are bookkeeping
// failures; the caller logs them and lets the container start.
func Record(cfg Config, stage Stage, st *specs.State) error {
	store, err := ledger.Open(cfg.StateDir)
	if err != nil {
		return err
	}
	var init *ledger.Process
	var cgroups []string
	if st.Pid > 0 {
		s, err := fingerprint.ReadStat(root(cfg), st.Pid)
		if err != nil {
			return fmt.Errorf("reading init process %d: %w", st.Pid, err)
		}
		init = &ledger.Process{PID: s.PID, StartTicks: s.StartTicks, Comm: s.Comm}
		// The runtime has put the init in the container's cgroup by now:
		// the janitor's evidence of running is matched against this
		// path, not against a name anyone can give a cgroup.
		if data, err := os.ReadFile(filepath.Join(root(cfg), strconv.Itoa(st.Pid), "cgroup")); err == nil {
			cgroups = strings.Fields(string(data))
		}
	}
	err = store.Update(st.ID, func(r *ledger.Record) error {
		if r.Stages == nil {
			r.Stages = map[string]time.Time{}
		}
		r.Stages[string(stage)] = time.Now().UTC()
		if st.Bundle != "" {
			r.Bundle = st.Bundle
		}
		if init != nil {
			r.Init = init
			r.Cgroups = cgroups
		}
		return nil
	})
	if err != nil {
		return err
	}
	launchSupervisor(cfg, stage, st, init) // logs its own failures; never fails the hook
	return nil
}

// Poststop finds the container's supervisor trees and hands them to
// reap.Run, which records them, reaps them, unlinks their sockets once
// their owners are dead and records the outcome. It never calls podman:
// the container is gone, and the State names it.
func Poststop(ctx context.Context, cfg Config, st *specs.State) (Result, error) {
	log := cfg.Logger
	var res Result
	store, err := ledger.Open(cfg.StateDir)
	if err != nil {
		// The ledger is bookkeeping (DESIGN "The outside"): with the state dir
		// read-only or full the trees are still reaped. A ledger that can
		// still be read still tells which kernels were this container's.
		log.Warn("ledger unavailable; reaping without recording", "err", err)
		res.Unrecorded = err
		store, _ = ledger.OpenReadOnly(cfg.StateDir)
	}
	var known map[trees.Key]string
	if store != nil {
		if rec, err := store.Load(st.ID); err == nil {
			known = ledger.KnownFrom([]*ledger.Record{rec}, store.CurrentBootID())
		}
	}
	var cache string
	if res.Unrecorded == nil {
		cache = ledger.LayoutCache(store)
	}
	// ByLeader: another container's supervisor's group is that
	// container's, read through its leader alone; a member of it carrying
	// this ID would make it ambiguous, which is never reaped here.
	found, stats, err := trees.Scan(trees.Options{Root: root(cfg), Comms: cfg.Comms, Known: known, Lister: cfg.Lister, LayoutCache: cache,
		Only: map[string]bool{st.ID: true}, ByLeader: true})
	if err != nil {
		return res, err
	}
	log.Debug("scanned processes", "processes", stats.Processes, "groups", stats.Groups, "stat_reads", stats.StatReads, "argv_reads", stats.ArgvReads, "full_reads", stats.FullReads, "lister", stats.Lister, "lister_fallback", stats.ListerFallback, "others_led", len(stats.OthersLed), "duration", stats.Duration)
	if len(stats.Stalled) > 0 {
		log.Warn("argv of some processes not read: their memory did not answer in time; a group they are in counts only if its other members tie it to the container", "pids", stats.StalledNote())
	}

	uids := translator(cfg)
	self := hostEUID(uids)
	var mine []reap.Tree
	// spared: a tree of the container left out here that its cgroup may
	// hold (the hook's own): no sweep of it (reap.Container.KeepCgroup).
	spared := false
	for _, t := range found {
		if !slices.Contains(t.ContainerIDs, st.ID) {
			continue
		}
		if t.HoldsCaller() {
			log.Warn("not touching the hook's own process group", "pgid", t.PGID)
			spared = true
			continue
		}
		host := -1
		if t.UID >= 0 {
			host, _ = uids.Host(t.UID)
		}
		// A tree of mixed UIDs (t.UID -1) is not another user's to leave
		// unsaid: reap refuses it, and the hook reports it (exit 1).
		if self != 0 && t.UID >= 0 && host != self {
			// Not in this user's cgroup (another user cannot move a
			// process there, and the sweep withholds other UIDs'
			// anyway): no reason to keep the cgroup, which anyone's
			// process carrying the ID would otherwise buy.
			// Another user's tree carrying the same ID (root's podman,
			// another user's) is theirs to reap: signalling it would fail
			// with EPERM, and this user's ledger is no place for it.
			log.Info("leaving another user's tree alone", "pgid", t.PGID, "uid", host, "hook_uid", self)
			continue
		}
		// The janitor and other users read the ledger in host terms; a
		// tree with no host UID is refused by reap.
		mine = append(mine, reap.Tree{Tree: t, HostUID: host})
	}
	// Every tree of a dead container is a stray: reap refuses the foreign,
	// ambiguous and unmapped ones and acts on the rest.
	var rec *ledger.Store
	if res.Unrecorded == nil {
		rec = store
	}
	// The groups left to their leaders' containers unread are spared by
	// the cgroup's sweep, as a group refused as ambiguous keeps it.
	spare := func(st fingerprint.Stat) bool { _, ok := slices.BinarySearch(stats.OthersLed, st.PGID); return ok }
	out := reap.Run(ctx, reap.Options{Root: root(cfg), Grace: cfg.KillGrace, Store: rec, Source: "poststop", Stage: string(StagePoststop), Contain: cfg.Contain, Logger: log, Spare: spare},
		reap.Container{ID: st.ID, Trees: mine, All: true, KeepCgroup: spared})
	res.Trees, res.Failed = out.Trees, out.Failed()
	for _, t := range out.Trees {
		if t.Action == action.SkipOtherUID || t.Action == action.SkipAmbiguous {
			res.Refused = append(res.Refused, t)
		}
	}
	if out.Unrecorded != nil {
		res.Unrecorded = out.Unrecorded
	}
	return res, nil
}

// translator is cfg.UIDs, else the hook's own map; without a readable
// map (no /proc/self), UIDs are taken as host UIDs.
func translator(cfg Config) userns.Translator {
	if cfg.UIDs != nil {
		return *cfg.UIDs
	}
	if tr, err := userns.SelfTranslator(); err == nil {
		return tr
	}
	return userns.Translator{Map: userns.Map{{Inside: 0, Outside: 0, Count: 1<<32 - 1}}, Overflow: -1}
}

// hostEUID is the hook's effective UID on the host.
func hostEUID(uids userns.Translator) int {
	if h, err := uids.Map.ToHost(os.Geteuid()); err == nil {
		return h
	}
	return os.Geteuid()
}

func root(cfg Config) string {
	if cfg.Root == "" {
		return fingerprint.DefaultRoot
	}
	return cfg.Root
}
