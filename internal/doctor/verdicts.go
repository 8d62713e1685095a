package doctor

import (
	"fmt"

	"github.com/kc-watchman/kc-watchman/internal/action"
	"github.com/kc-watchman/kc-watchman/internal/containerid"
	"github.com/kc-watchman/kc-watchman/internal/cull"
	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/reconcile"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// StraysInput is what the strays check looks at.
type StraysInput struct {
	// LivenessErr is set when an engine could not be asked; Report is then
	// meaningless.
	LivenessErr error
	Report      reconcile.Report
	// Fix is true when the strays were reaped (reconcile --apply).
	Fix bool
}

func describeTree(t reconcile.Tree) string {
	cid := containerid.Short(t.ContainerID)
	age := "age ?"
	if t.AgeSeconds >= 0 {
		age = "age " + cull.HumanSeconds(t.AgeSeconds)
	}
	s := fmt.Sprintf("container %s pgid %d uid %d %s: %s: %s", cid, t.PGID, t.UID, age, reconcile.MembersText(t.Members, reconcile.ShownMembers), t.Action)
	if t.Error != nil {
		s += ": " + *t.Error
	}
	return s
}

// Strays checks for supervisor trees whose container is gone.
func Strays(in StraysInput) Check {
	if in.LivenessErr != nil {
		c := newCheck(NameStrays, Warn, "not checked: ground truth unknown; nothing was touched")
		c.Remedy = "make every engine asked answer (see the engines' checks)"
		return c
	}
	rep := in.Report
	var items []string
	for _, t := range rep.Trees {
		switch t.Action {
		case action.WouldReap, action.Reaped, action.Gone, action.WouldNotDie:
			items = append(items, describeTree(t))
		}
	}
	strayTrees := len(items)
	// A gone container's supervisor cgroup holding processes is a stray
	// too, listed where no stray tree of its container stands for it.
	withTrees := map[string]bool{}
	for _, t := range rep.Trees {
		withTrees[t.ContainerID] = true
	}
	cgroupsLeft := 0
	for _, cg := range rep.Cgroups {
		if cg.Outcome == action.WouldNotDie {
			cgroupsLeft++
		}
		switch {
		case cg.Outcome == action.WouldNotDie,
			(cg.Outcome == action.WouldReap || cg.Outcome == action.Reaped) && !withTrees[cg.ContainerID]:
			items = append(items, fmt.Sprintf("container %s: cgroup %s: %s", containerid.Short(cg.ContainerID), cg.Path, cg.Outcome))
		}
	}
	others := len(rep.Trees) - strayTrees
	switch {
	case len(items) == 0 && others == 0:
		return newCheck(NameStrays, OK, "none")
	case len(items) == 0:
		return newCheck(NameStrays, OK, "none; %s with a live container, young, or not ours", plural(others, "tree", "trees"))
	}
	reaped := rep.Count(action.Reaped) + rep.Count(action.Gone)
	var c Check
	switch {
	case !in.Fix && rep.WouldRefuse != "":
		c = newCheck(NameStrays, Warn, "%s; --fix would reap none of them: %s", plural(strayTrees, "stray tree", "stray trees"), rep.WouldRefuse)
		c.Remedy = "check the engines' answers first: a wrong ground truth at scale looks like this; then reconcile --apply with a higher --max-reap"
	case !in.Fix:
		c = newCheck(NameStrays, Warn, "%s", plural(len(items), "stray tree", "stray trees"))
		c.Remedy = "run kc-janitor doctor --fix or kc-janitor reconcile --apply to reap them"
	case rep.Refused != "":
		c = newCheck(NameStrays, Error, "nothing reaped: %s", rep.Refused)
		c.Remedy = "check the engines' answers first: a wrong ground truth at scale looks like this; then reconcile --apply with a higher --max-reap"
	case rep.Count(action.WouldNotDie) > 0 || cgroupsLeft > 0:
		c = newCheck(NameStrays, Error, "reaped %d, %d would not die", reaped, rep.Count(action.WouldNotDie)+cgroupsLeft)
		c.Remedy = "look at the processes listed (a process in D state, or one a debugger holds, ignores SIGKILL) and run doctor --fix again"
	case rep.Unrecorded != nil:
		c = newCheck(NameStrays, Error, "reaped %s, but not recorded in the ledger: %v", plural(reaped, "stray tree", "stray trees"), rep.Unrecorded)
		c.Remedy = "fix the state dir (see its check): what is reaped unrecorded leaves no audit trail"
	default:
		c = newCheck(NameStrays, OK, "fixed: reaped %s", plural(reaped, "stray tree", "stray trees"))
	}
	c.Items = items
	return c
}

// Skipped is check name not run, and why: ok, as it was not asked for.
func Skipped(name, why string) Check {
	return newCheck(name, OK, "%s", why)
}

// Sockets checks for orphan kc-*.sock sockets (a dry-run sweep).
func Sockets(rep *sweep.Report, err error) Check {
	if err != nil {
		return newCheck(NameSockets, Warn, "could not sweep: %v", err)
	}
	count := map[sweep.Verdict]int{}
	var items []string
	for _, s := range rep.Sockets {
		count[s.Verdict]++
		if s.Verdict == sweep.VerdictStale {
			items = append(items, fmt.Sprintf("%s (%s, pid %d): %s", s.Path, s.Kind, s.PID, s.Reason))
		}
	}
	for _, e := range rep.DirErrors {
		items = append(items, "unreadable: "+e.Error())
	}
	summary := fmt.Sprintf("%s: %d live, %d stale, %d unknown", plural(len(rep.Sockets), "socket", "sockets"),
		count[sweep.VerdictLive], count[sweep.VerdictStale], count[sweep.VerdictUnknown])
	verdict, remedy := OK, ""
	if count[sweep.VerdictStale] > 0 {
		verdict, remedy = Warn, "run kc-janitor sweep --apply to unlink the stale ones"
	}
	if len(rep.DirErrors) > 0 {
		verdict = Warn
	}
	c := newCheck(NameSockets, verdict, "%s", summary)
	c.Remedy = remedy
	c.Items = items
	return c
}

// Sessions checks for abandoned kernel sessions (a cull audit).
func Sessions(sups []cull.Supervisor, thresholdSeconds int64, err error) Check {
	if err != nil {
		return newCheck(NameSessions, Warn, "could not audit: %v", err)
	}
	n, unreadable := 0, 0
	var mem int64
	var items []string
	for _, s := range sups {
		if s.Err != nil {
			unreadable++
			items = append(items, fmt.Sprintf("%s (pid %d): cannot read sessions: %v", s.Socket, s.PID, s.Err))
			continue
		}
		for _, c := range s.Candidates {
			n++
			mem = kallichore.AddBytes(mem, c.MemoryBytes())
			items = append(items, fmt.Sprintf("%s (pid %d): session %s (%s) idle %s, %s, %s",
				s.Socket, s.PID, c.SessionID, c.Language, cull.HumanSeconds(c.IdleSeconds),
				cull.HumanBytes(c.MemoryBytes()), c.WorkingDirectory))
		}
		if s.Unlisted > 0 {
			n += s.Unlisted
			mem = kallichore.AddBytes(mem, s.UnlistedMemoryBytes)
			items = append(items, fmt.Sprintf("%s (pid %d): %d more idle sessions, %s, not listed (the audit's bound)",
				s.Socket, s.PID, s.Unlisted, cull.HumanBytes(s.UnlistedMemoryBytes)))
		}
	}
	detail := fmt.Sprintf("%s idle and disconnected for more than %s in %s", plural(n, "session", "sessions"), cull.ExactSeconds(thresholdSeconds),
		plural(len(sups), "live supervisor", "live supervisors"))
	verdict, remedy := OK, ""
	if n > 0 {
		verdict = Warn
		detail += fmt.Sprintf(", holding %s", cull.HumanBytes(mem))
		remedy = "see kc-janitor cull, and shut the sessions down from their UI if they are not wanted"
	}
	if unreadable > 0 {
		verdict = Warn
		detail += fmt.Sprintf("; %d unreadable", unreadable)
	}
	c := newCheck(NameSessions, verdict, "%s", detail)
	c.Remedy = remedy
	c.Items = items
	return c
}

// ScanFailed is the strays check when /proc could not be scanned.
func ScanFailed(err error) Check {
	c := newCheck(NameStrays, Error, "cannot scan processes: %v", err)
	c.Remedy = procRemedy
	return c
}

// StateDirFailed is the stray-trees check of a --fix whose state dir
// could not be locked or opened after the scan: nothing was reaped.
func StateDirFailed(err error) Check {
	c := newCheck(NameStrays, Error, "%v", err)
	c.Remedy = "see the state dir check: it must be a directory of this UID (no symlink), closed to others, under directories only root (or this UID) can change; another reaping run may hold its apply lock"
	return c
}

// procRemedy is what to do when /proc cannot be listed or read.
const procRemedy = "check that /proc is mounted and readable here (hidepid= hides other users' processes from all but root)"
