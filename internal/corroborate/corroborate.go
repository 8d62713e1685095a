// Package corroborate looks for local evidence that a container still runs
// (DESIGN "Ground truth must be corroborated"). An engine's list is ground truth only if it is the right
// list: an engine asked about another store (a different --root, another
// user's service) answers with a list that is complete and wrong. Before a
// tree is called stray, its container's conmon or containerd shim, or the
// init process the hook recorded for it, still being alive wins over the
// engine's silence.
package corroborate

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/proctable"
)

// Kinds of evidence.
const (
	// KindMonitor: a live conmon or containerd-shim* carries the ID in argv.
	KindMonitor = "monitor"
	// KindLedgerInit: the ledger holds, from this boot, the container's
	// init process, still alive, and no poststop after it.
	KindLedgerInit = "ledger-init"
)

// Evidence is one sign that a container still runs here.
type Evidence struct {
	ContainerID string
	Kind        string
	PID         int
	StartTicks  uint64
	Comm        string
	// UID is the monitor's real UID (KindMonitor only).
	UID int
}

func (e Evidence) String() string {
	switch e.Kind {
	case KindMonitor:
		return fmt.Sprintf("its %s (pid %d) is alive", e.Comm, e.PID)
	case KindLedgerInit:
		return fmt.Sprintf("its init process (pid %d) recorded by kc-hook is alive with no poststop", e.PID)
	}
	return e.Kind
}

// Checker answers "does this container still run here?" from the run's
// snapshot of the host and the ledger. Monitors are looked for once, on
// the first question, so a run with no stray candidates reads nothing
// more; and they are looked for in the snapshot, never by listing /proc
// again (DESIGN "One view of the host"): only the argv of the processes named like a monitor
// is read.
type Checker struct {
	root    string
	snap    *proctable.Listing
	records map[string]*ledger.Record
	boot    string

	scanned  bool
	monitors map[string][]Evidence
	scanErr  error
}

// New returns a Checker over the procfs mount root (default /proc), the
// snapshot the run's decisions read (taken with Watch as its
// proctable.Options.Watch; nil: the first question lists the host
// itself, for a run whose scan kept no listing) and the ledger records of
// the boot bootID (records may be nil).
func New(root string, snap *proctable.Listing, records []*ledger.Record, bootID string) *Checker {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	c := &Checker{root: root, snap: snap, boot: bootID, records: map[string]*ledger.Record{}}
	for _, r := range records {
		if r != nil {
			c.records[r.ContainerID] = r
		}
	}
	return c
}

// Running returns the evidence that container id, whose tree runs as uid,
// still runs here, if any. A monitor counts only when it runs as root or
// as uid: anyone can start a process named conmon, and another user's must
// not hold root's janitor back. An error means the monitors could not be
// looked for.
func (c *Checker) Running(id string, uid int) (Evidence, bool, error) {
	if id == "" {
		return Evidence{}, false, nil
	}
	if e, ok := c.ledgerInit(id); ok {
		return e, true, nil
	}
	if !c.scanned {
		c.monitors, c.scanErr = c.scanMonitors()
		c.scanned = true
	}
	for _, e := range c.monitors[id] {
		if e.UID == 0 || e.UID == uid {
			return e, true, nil
		}
	}
	return Evidence{}, false, c.scanErr
}

// ledgerInit: a record of this boot whose init identity (pid and start
// time) is alive, and no poststop ran after the init was recorded.
func (c *Checker) ledgerInit(id string) (Evidence, bool) {
	r := c.records[id]
	if r == nil || r.Init == nil || c.boot == "" || r.BootID != c.boot {
		return Evidence{}, false
	}
	if stopped(r) {
		return Evidence{}, false
	}
	st, err := fingerprint.Revalidate(c.root, fingerprint.Stat{PID: r.Init.PID, StartTicks: r.Init.StartTicks})
	if err != nil || st.Zombie() {
		return Evidence{}, false
	}
	return Evidence{ContainerID: id, Kind: KindLedgerInit, PID: st.PID, StartTicks: st.StartTicks, Comm: st.Comm}, true
}

// stopped reports whether a poststop ran after the last stage that
// recorded the init process.
func stopped(r *ledger.Record) bool {
	post, ok := r.Stages["poststop"]
	if !ok {
		return false
	}
	var init time.Time
	for _, s := range []string{"createRuntime", "prestart", "createContainer", "startContainer", "poststart"} {
		if t := r.Stages[s]; t.After(init) {
			init = t
		}
	}
	return !post.Before(init)
}

// IsMonitor reports whether comm names a container monitor that carries
// its container's ID in argv: podman's conmon, or a containerd shim (comm
// is cut to 15 bytes: "containerd-shim" for containerd-shim-runc-v2).
func IsMonitor(comm string) bool {
	return comm == "conmon" || strings.HasPrefix(comm, "containerd-shim")
}

// Watch is IsMonitor for proctable.Options.Watch: the snapshot a Checker
// reads must be taken with it.
func Watch(comm []byte) bool {
	return string(comm) == "conmon" || bytes.HasPrefix(comm, []byte("containerd-shim"))
}

// scanMonitors maps each container ID carried by a live monitor's argv to
// that monitor, from the snapshot's monitors: one cmdline read each where
// the snapshot knows their UIDs (the task iterator's), a full identity
// where it does not.
func (c *Checker) scanMonitors() (map[string][]Evidence, error) {
	snap := c.snap
	if snap == nil {
		l, err := proctable.List(proctable.Options{Root: c.root, Watch: Watch})
		if err != nil {
			return nil, fmt.Errorf("listing processes for container monitors: %w", err)
		}
		snap = l
	}
	r := proctable.NewReader(c.root)
	defer r.Close()
	procs, err := snap.WatchedAll(r)
	if err != nil {
		return nil, fmt.Errorf("looking for container monitors: %w", err)
	}
	out := map[string][]Evidence{}
	for _, p := range procs {
		if p.Zombie || !IsMonitor(p.Comm) {
			continue
		}
		e := Evidence{Kind: KindMonitor, PID: p.PID, StartTicks: p.StartTicks, Comm: p.Comm, UID: p.UID}
		var argv []string
		if p.UID >= 0 {
			// A PID reused since the snapshot can only add evidence,
			// which spares a tree: never the wrong way round.
			if argv, err = r.Argv(p.PID); err != nil {
				continue
			}
		} else {
			id, err := r.IdentitySince(p.PID, p.StartTicks)
			if err != nil || id.Zombie() || !IsMonitor(id.Comm) {
				continue
			}
			argv, e.UID = id.Argv, id.UID
		}
		for _, cid := range containerid.FromArgv(argv) {
			e.ContainerID = cid
			out[cid] = append(out[cid], e)
		}
	}
	return out, nil
}
