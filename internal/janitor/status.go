package janitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/engine"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/printable"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
	"github.com/kc-watchman/kc-watchman/internal/trees"
)

// StatusReport is status's view: the ledger, the trees running now with
// what reconcile would decide, and the sockets as a dry-run sweep sees
// them. Nothing is changed to make it, not even the ledger.
type StatusReport struct {
	StateDir      string             `json:"state_dir"`
	Records       []statusRecord     `json:"records"`
	LivenessKnown bool               `json:"liveness_known"`
	Source        string             `json:"source"`
	Trees         []statusTree       `json:"trees"`
	Sockets       []sweep.SocketJSON `json:"sockets"`
	// WouldRefuse says why reconcile --apply would reap none of the
	// would-reap trees (its blast-radius guard), as reconcile's report.
	WouldRefuse string `json:"would_refuse,omitempty"`
	// SocketsSkipped says why the sockets were not looked at (a run
	// scoped with --container does not widen to the host's).
	SocketsSkipped string   `json:"sockets_skipped,omitempty"`
	Errors         []string `json:"errors"`
	// truth is the engines' answer the text report names.
	truth engine.Truth
}

type statusRecord struct {
	ContainerID  string               `json:"container_id"`
	CurrentBoot  bool                 `json:"current_boot"`
	Stages       map[string]time.Time `json:"stages"`
	Trees        int                  `json:"trees"`
	Members      int                  `json:"members"`
	Outcome      string               `json:"outcome"`
	UpdatedAt    time.Time            `json:"updated_at"`
	ContainerNow string               `json:"container_state"`
	// Engine is the engine that lists the container (podman, docker,
	// containerd); "" when none does or none could be asked.
	Engine string `json:"engine"`
}

type statusTree struct {
	ContainerID    string             `json:"container_id"`
	ContainerState string             `json:"container_state"`
	Engine         string             `json:"engine"`
	PGID           int                `json:"pgid"`
	UID            int                `json:"uid"`
	AgeSeconds     int64              `json:"age_seconds"`
	ByLedger       bool               `json:"by_ledger"`
	Members        []reconcile.Member `json:"members"`
	Withheld       []reconcile.Member `json:"withheld,omitempty"`
	// Action is what reconcile would decide for the tree, under the key
	// reconcile's own JSON gives it; "?" when ground truth is unknown.
	Action string `json:"action"`
	// Decision is Action under its former key, kept for one release.
	//
	// Deprecated: read Action.
	Decision string `json:"decision"`
}

// Status gathers status's view. The error is a usage error only (a
// malformed --engine or endpoint); everything else it meets is listed in
// the report's errors.
func Status(ctx context.Context, s Settings, log *slog.Logger) (StatusReport, error) {
	out := StatusReport{StateDir: s.StateDir, Records: []statusRecord{}, Trees: []statusTree{}, Sockets: []sweep.SocketJSON{}, Errors: []string{}}

	tr, liveErr := s.Ask(ctx, log)
	if liveErr != nil && !errors.Is(liveErr, engine.ErrUnknown) {
		return out, liveErr // a usage error
	}
	out.truth = tr
	live, known := tr.Set, liveErr == nil
	out.LivenessKnown = known
	if known {
		out.Source = string(live.Source)
	} else {
		out.Errors = append(out.Errors, "engines: "+liveErr.Error())
	}
	// Which engine each container is from, even when another engine
	// could not be asked: the column says who listed it, not whether
	// its tree may be judged.
	engineOf := tr.EngineByID()

	// The ledger, read-only.
	var records []*ledger.Record
	var bootID string
	if store, err := ledger.OpenReadOnly(s.StateDir); err == nil {
		var errs []error
		records, errs = store.List()
		bootID = store.CurrentBootID()
		for _, e := range errs {
			out.Errors = append(out.Errors, "ledger: "+e.Error())
		}
	} else if _, serr := os.Stat(s.StateDir); !errors.Is(serr, fs.ErrNotExist) {
		// A state dir not there yet is no problem: no hook has run here
		// (a Docker host), or none since boot.
		out.Errors = append(out.Errors, "ledger: "+err.Error())
	}
	sort.Slice(records, func(i, j int) bool { return records[i].UpdatedAt.After(records[j].UpdatedAt) })
	for _, r := range records {
		if len(s.Reconcile.Containers) > 0 && !s.Reconcile.Containers[r.ContainerID] {
			continue
		}
		j := statusRecord{ContainerID: r.ContainerID, CurrentBoot: r.BootID == bootID, Stages: r.Stages,
			Trees: len(r.Trees), Outcome: r.Outcome, UpdatedAt: r.UpdatedAt, ContainerNow: liveState(live, known, r.ContainerID), Engine: engineOf[r.ContainerID]}
		for _, t := range r.Trees {
			j.Members += len(t.Members)
		}
		out.Records = append(out.Records, j)
	}

	// The trees running now (a scan; nothing is signalled or recorded).
	found, _, err := trees.Scan(trees.Options{Comms: s.Reconcile.Comms, Known: ledger.KnownFrom(records, bootID), Full: s.Reconcile.FullScan, Lister: s.Reconcile.Lister})
	if err != nil {
		out.Errors = append(out.Errors, "scanning processes: "+err.Error())
	}
	for _, t := range found {
		if len(s.Reconcile.Containers) > 0 && !anyIn(t.ContainerIDs, s.Reconcile.Containers) {
			continue
		}
		if t.HoldsCaller() {
			continue // reconcile leaves out the tree it runs in
		}
		j := statusTree{ContainerID: t.ContainerID, ContainerState: liveState(live, known, t.ContainerID), Engine: engineOf[t.ContainerID],
			PGID: t.PGID, UID: t.UID, AgeSeconds: -1, ByLedger: t.ByLedger, Members: []reconcile.Member{}, Action: "?"}
		if t.AgeKnown {
			j.AgeSeconds = int64(t.Age / time.Second)
		}
		j.Members, j.Withheld = reconcile.MembersOf(t), reconcile.WithheldOf(t)
		if known {
			j.Action = string(reconcile.Decide(t, live, s.Reconcile.MinAge))
		}
		j.Decision = j.Action
		out.Trees = append(out.Trees, j)
	}
	if known && slices.ContainsFunc(out.Trees, func(j statusTree) bool { return j.Action == string(action.WouldReap) }) {
		out.corroborate(ctx, s, log)
	}

	// Sockets, as a dry-run sweep classifies them: the host's, unless
	// the run is scoped to containers.
	if why := socketsOutOfScope(s); why != "" {
		out.SocketsSkipped = why
		return out, nil
	}
	scfg := s.Sockets
	scfg.Apply = false
	srep, err := sweep.Sweep(ctx, scfg)
	if err != nil {
		out.Errors = append(out.Errors, "sockets: "+err.Error())
	} else {
		for _, e := range srep.DirErrors {
			out.Errors = append(out.Errors, "sockets: "+e.Error())
		}
		for _, k := range srep.Sockets {
			out.Sockets = append(out.Sockets, k.JSON(false))
		}
	}

	return out, nil
}

// corroborate decides the trees as reconcile would, with its local
// evidence (a stray whose container still runs here is
// skipped-contradicted; two such containers make its truth unknown),
// through reconcile's own path as doctor's look takes it: nothing
// changes, the ledger included.
func (out *StatusReport) corroborate(ctx context.Context, s Settings, log *slog.Logger) {
	look := s
	look.Reconcile.Apply = false
	rep, _, liveErr, err := ScanThenAsk(ctx, look, false, log)
	switch {
	case err != nil:
		out.Errors = append(out.Errors, "deciding as reconcile: "+err.Error())
		return
	case liveErr != nil:
		// Reconcile would touch nothing: no tree's decision is known.
		out.Errors = append(out.Errors, "reconcile: "+liveErr.Error())
		// Nor is any container's state: "gone" was the answer's word.
		out.LivenessKnown, out.Source = false, ""
		for i := range out.Trees {
			out.Trees[i].Action, out.Trees[i].Decision, out.Trees[i].ContainerState = "?", "?", "?"
		}
		for i := range out.Records {
			out.Records[i].ContainerNow = "?"
		}
		return
	}
	out.WouldRefuse = rep.WouldRefuse
	// Every tree as reconcile's own look decided it: not only the
	// contradicted ones (its scan is later than status's own).
	for _, rt := range rep.Trees {
		for i, j := range out.Trees {
			if j.PGID == rt.PGID && j.ContainerID == rt.ContainerID {
				out.Trees[i].Action, out.Trees[i].Decision = string(rt.Action), string(rt.Action)
			}
		}
	}
}

// anyIn says whether one of ids is in set.
func anyIn(ids []string, set map[string]bool) bool {
	for _, id := range ids {
		if set[id] {
			return true
		}
	}
	return false
}

// short is a container ID as the tables show it.
func short(id string) string {
	if id == "" {
		return "-"
	}
	return containerid.Short(id)
}

// Text writes status's text report.
func (st StatusReport) Text(w io.Writer) error {
	tr, known := st.truth, st.LivenessKnown
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)

	fmt.Fprintf(tw, "LEDGER %s: %s\n", st.StateDir, countOf(len(st.Records), "record"))
	if len(st.Records) > 0 {
		fmt.Fprintln(tw, "CONTAINER\tENGINE\tNOW\tSTAGES SEEN\tTREES\tOUTCOME\tUPDATED")
		for _, r := range st.Records {
			stages := make([]string, 0, len(r.Stages))
			for s := range r.Stages {
				stages = append(stages, s)
			}
			sort.Slice(stages, func(i, j int) bool { return r.Stages[stages[i]].Before(r.Stages[stages[j]]) })
			if len(stages) == 0 {
				stages = []string{"-"}
			}
			trees := fmt.Sprintf("%d (%d procs)", r.Trees, r.Members)
			updated := since(r.UpdatedAt)
			if !r.CurrentBoot {
				updated += ", other boot"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(r.ContainerID), cull.Dash(r.Engine), r.ContainerNow, strings.Join(stages, ","), trees, cull.Dash(r.Outcome), updated)
		}
	}

	truth := "ground truth unknown: an engine did not answer, or local evidence contradicts its answer; see PROBLEMS"
	if known {
		var asked []string
		for _, st := range tr.Statuses {
			asked = append(asked, st.Name+" "+st.Source)
		}
		truth = fmt.Sprintf("%s, %d live containers", strings.Join(asked, ", "), len(tr.Set.Live))
	}
	fmt.Fprintf(tw, "\nTREES (%s): %s\n", truth, countOf(len(st.Trees), "tree"))
	if len(st.Trees) > 0 {
		fmt.Fprintln(tw, "CONTAINER\tENGINE\tSTATE\tPGID\tUID\tAGE\tMEMBERS\tRECONCILE WOULD")
		for _, t := range st.Trees {
			age := "?"
			if t.AgeSeconds >= 0 {
				age = cull.HumanSeconds(t.AgeSeconds)
			}
			cid := short(t.ContainerID)
			if t.ByLedger {
				cid += "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", cid, cull.Dash(t.Engine), t.ContainerState, t.PGID, t.UID, age, reconcile.MembersText(t.Members, reconcile.ShownMembers), t.Action)
		}
	}
	if st.WouldRefuse != "" {
		fmt.Fprintf(tw, "reconcile --apply would reap none of them: %s\n", st.WouldRefuse)
	}

	if st.SocketsSkipped != "" {
		fmt.Fprintf(tw, "\nSOCKETS: %s\n", st.SocketsSkipped)
	} else {
		fmt.Fprintf(tw, "\nSOCKETS: %s\n", countOf(len(st.Sockets), "socket"))
	}
	if len(st.Sockets) > 0 {
		fmt.Fprintln(tw, "PATH\tKIND\tPID\tVERDICT\tREASON")
		for _, s := range st.Sockets {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", printable.Quote(s.Path), s.Kind, s.PID, s.Verdict, printable.Quote(s.Reason))
		}
	}
	if len(st.Errors) > 0 {
		fmt.Fprintln(tw, "\nPROBLEMS")
		for _, e := range st.Errors {
			fmt.Fprintf(tw, "  %s\n", printable.Quote(e))
		}
	}
	return tw.Flush()
}

// countOf is "1 tree", "2 trees".
func countOf(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// since renders how long ago t was, for the text reports.
func since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	if d < 0 {
		d = 0
	}
	return cull.HumanSeconds(int64(d/time.Second)) + " ago"
}

// liveState names a container's state for the reports: its engine's raw
// state, "gone" when no engine lists it, "?" when an engine could not be
// asked.
func liveState(live engine.Set, known bool, id string) string {
	switch {
	case !known:
		return "?"
	case id == "":
		return "-"
	}
	if s, ok := live.States[id]; ok {
		return s
	}
	return "gone"
}

// socketsOutOfScope says why a command scoped with --container does not
// look at the host's default socket dirs (it never widens past the
// containers named), or "": dirs named with --socket-dir are looked at.
func socketsOutOfScope(s Settings) string {
	if len(s.Reconcile.Containers) == 0 || s.Sockets.Target.Container() || len(s.Sockets.Dirs) > 0 {
		return ""
	}
	return "not looked at: --container names containers, and the host's socket dirs are not theirs (name dirs with --socket-dir; sweep or cull --container look inside one)"
}
