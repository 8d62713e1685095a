// Package action is the one vocabulary for what was done, or deliberately
// not done, to a supervisor tree. The strings are an outside contract:
// reconcile's JSON and log lines (DESIGN "The outside"), the ledger's trees and
// outcomes (DESIGN "kc-hook", "Ledger") and the metrics' labels print them as they are, so a
// constant here is never renamed, only added.
package action

import "strings"

// Action is what happened to one tree, or what would.
type Action string

// What was done to a tree, by pgkill's kill or in a dry run.
const (
	// WouldReap: a stray, left alone because the run is a dry run.
	WouldReap Action = "would-reap"
	// Reaped: the group was signalled and every member is dead.
	Reaped Action = "reaped"
	// Gone: no recorded member occupied the group any more; nothing was
	// signalled.
	Gone Action = "gone"
	// WouldNotDie: signalling failed or members survived SIGKILL.
	WouldNotDie Action = "would-not-die"
)

// Why a tree was not signalled. Every one starts with skipPrefix.
const (
	SkipLive       Action = "skipped-live"
	SkipYoung      Action = "skipped-young"
	SkipAgeUnknown Action = "skipped-age-unknown"
	// SkipForeign: the group's live leader is not in the supervisor set
	// (DESIGN "Identity rules").
	SkipForeign Action = "skipped-foreign"
	// SkipOtherUID: the tree's UID is not one the caller has ground truth
	// for, or may signal.
	SkipOtherUID Action = "skipped-other-uid"
	// SkipAmbiguous: members name two containers, or the tree was read
	// only in part (reap refuses it whoever hands it over).
	SkipAmbiguous Action = "skipped-ambiguous"
	// SkipContradicted: the engines do not list the container but local
	// evidence says it still runs (DESIGN "Ground truth must be corroborated").
	SkipContradicted Action = "skipped-contradicted"
)

// Skips are the reasons above, in the order reports give them.
var Skips = []Action{SkipLive, SkipYoung, SkipAgeUnknown, SkipForeign, SkipOtherUID, SkipAmbiguous, SkipContradicted}

// Nothing is a ledger record's outcome when no tree was there to act on.
const Nothing Action = "nothing"

const skipPrefix = "skipped-"

// IsSkip reports whether a is a decision not to signal the tree. It goes
// by the prefix rather than the list above so that a ledger written by a
// later version, with a reason this one does not know, still reads as a
// refusal: a refused tree must never be taken for the container's to reap.
func (a Action) IsSkip() bool { return strings.HasPrefix(string(a), skipPrefix) }

// Killed reports whether a is the outcome of a kill that left the group
// without its members (reaped, or already gone): its sockets' owners are
// dead.
func (a Action) Killed() bool { return a == Reaped || a == Gone }
