package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
)

// ErrNoMatch and ErrAmbiguous are ResolveOne's usage errors: the reference
// names no container, or more than one.
var (
	ErrNoMatch   = errors.New("no such container")
	ErrAmbiguous = errors.New("more than one container matches")
)

// ResolveOne resolves ref (full ID, unique ID prefix or name) with every
// engine. Exactly one container must match across all of them; no match
// wraps ErrNoMatch and several wrap ErrAmbiguous, naming the candidates
// (both also wrap ErrUsage). An engine that cannot be asked makes the
// answer unknown (ErrUnknown) unless ref is the full ID of the one match:
// the engine we could not ask may hold another container of that name,
// or the container a missing name is.
func ResolveOne(ctx context.Context, engines []Engine, ref string) (Match, error) {
	if ref == "" {
		return Match{}, fmt.Errorf("%w: empty container reference", ErrUsage)
	}
	var all []Match
	var failed []error
	for _, e := range engines {
		ms, err := e.Resolve(ctx, ref)
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		all = append(all, ms...)
	}
	all = sameContainers(all)
	// A full ID beats a name or prefix match elsewhere: docker's and
	// podman's IDs are 64 hex and a name could be one too, but an exact
	// ID match is what the user meant.
	if containerid.Valid(ref) {
		var exact []Match
		for _, m := range all {
			if m.ID == ref {
				exact = append(exact, m)
			}
		}
		if len(exact) > 0 {
			all = exact
		}
	}
	switch {
	case len(all) == 1 && (len(failed) == 0 || containerid.Valid(ref) && all[0].ID == ref):
		return all[0], nil
	case len(all) > 1:
		return Match{}, fmt.Errorf("%w: %w %q: %s", ErrUsage, ErrAmbiguous, ref, candidates(all))
	case len(failed) > 0:
		return Match{}, fmt.Errorf("%w: container %q: %w", ErrUnknown, ref, errors.Join(failed...))
	}
	names := make([]string, 0, len(engines))
	for _, e := range engines {
		names = append(names, e.Name())
	}
	return Match{}, fmt.Errorf("%w: %w: %q (asked %s)", ErrUsage, ErrNoMatch, ref, strings.Join(names, ", "))
}

// sameContainers merges the matches of one container found by several
// engines (dockerd's containers are containerd's too, in namespace moby)
// into the first engine's, which names it in Known order: one
// container, not an ambiguity. Only matches of different engines that
// agree on the init are merged: one ID in two containerd namespaces is
// two containers, and so is a stopped container (no init) and a running
// one of that ID elsewhere, whose init must not be lent to it.
func sameContainers(ms []Match) []Match {
	out := ms[:0:0]
	for _, m := range ms {
		i := slices.IndexFunc(out, func(o Match) bool {
			return o.ID == m.ID && o.Engine != m.Engine && o.InitPID == m.InitPID
		})
		if i < 0 {
			out = append(out, m)
			continue
		}
		for _, n := range m.Names {
			if !slices.Contains(out[i].Names, n) {
				out[i].Names = append(out[i].Names, n)
			}
		}
	}
	return out
}

func candidates(ms []Match) string {
	var parts []string
	for _, m := range ms {
		s := m.Engine + " " + containerid.Short(m.ID)
		if len(m.Names) > 0 {
			s += " (" + strings.Join(m.Names, ",") + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
