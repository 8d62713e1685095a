// Package corroborate looks for local evidence that a container still runs
// (DESIGN §13). An engine's list is ground truth only if it is the right
// list: an engine asked about another store (a different --root, another
// user's service) answers with a list that is complete and wrong. Before a
// tree is called stray, its container's conmon or containerd shim, or the
// init process the hook recorded for it, still being alive wins over the
// engine's silence.
package corroborate

import (
	"bytes"
	"fmt"
	"os"
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

// Checker answers "does this container still run here?" from /proc and the
// ledger. The /proc walk for monitors is made once, on the first question,
// so a run with no stray candidates costs nothing.
type Checker struct {
	root    string
	records map[string]*ledger.Record
	boot    string

	scanned  bool
	monitors map[string][]Evidence
	scanErr  error
}

// New returns a Checker over the procfs mount root (default /proc) and the
// ledger records of the boot bootID (records may be nil).
func New(root string, records []*ledger.Record, bootID string) *Checker {
	if root == "" {
		root = fingerprint.DefaultRoot
	}
	c := &Checker{root: root, boot: bootID, records: map[string]*ledger.Record{}}
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
// not hold root's janitor back. An error means /proc could not be walked.
func (c *Checker) Running(id string, uid int) (Evidence, bool, error) {
	if id == "" {
		return Evidence{}, false, nil
	}
	if e, ok := c.ledgerInit(id); ok {
		return e, true, nil
	}
	if !c.scanned {
		c.monitors, c.scanErr = scanMonitors(c.root)
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

// scanMonitors maps each container ID carried by a live monitor's argv to
// that monitor. Only comm is read for most processes.
func scanMonitors(root string) (map[string][]Evidence, error) {
	pids, err := proctable.PIDs(root)
	if err != nil {
		return nil, fmt.Errorf("listing processes for container monitors: %w", err)
	}
	out := map[string][]Evidence{}
	for _, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("%s/%d/comm", root, pid))
		if err != nil || !IsMonitor(string(bytes.TrimSpace(comm))) {
			continue
		}
		id, err := fingerprint.Read(root, pid)
		if err != nil || id.Zombie() || !IsMonitor(id.Comm) {
			continue
		}
		for _, cid := range containerid.FromArgv(id.Argv) {
			out[cid] = append(out[cid], Evidence{ContainerID: cid, Kind: KindMonitor, PID: pid, StartTicks: id.StartTicks, Comm: id.Comm, UID: id.UID})
		}
	}
	return out, nil
}
