// Package cull audits the kernel sessions of live Kallichore supervisors
// for abandoned ones: disconnected, idle, and idle for longer than a
// threshold. It reads GET /sessions and reports; it never shuts anything
// down (reclaiming a session stays a human decision).
package cull

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
	"github.com/kc-watchman/kc-watchman/internal/sockets"
	"github.com/kc-watchman/kc-watchman/internal/sweep"
)

// DefaultIdle is the default threshold: a day, as in the seed culler.
const DefaultIdle = 24 * time.Hour

// IsCandidate is the culling rule: connected == false, status == "idle"
// and idle_seconds strictly greater than thresholdSeconds.
func IsCandidate(s kallichore.ActiveSession, thresholdSeconds int64) bool {
	return !s.Connected && s.Status == "idle" && s.IdleSeconds > thresholdSeconds
}

// ParseIdle parses a threshold: a bare non-negative integer is seconds
// (KC_IDLE_SECONDS=86400, as the seed scripts take it), anything else a
// Go duration ("24h", "90m"). It returns whole seconds.
func ParseIdle(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty idle threshold")
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("idle threshold %q is negative", s)
		}
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("idle threshold %q: want seconds or a duration like 24h", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("idle threshold %q is negative", s)
	}
	return int64(d / time.Second), nil
}

// Source is one supervisor to audit.
type Source struct {
	Socket string // path of its control socket, as reported
	PID    int    // its PID as named by the socket (0 if unknown)
	// Owner is who owns the socket file (sweep.Socket.Owner; 0: the
	// host's root, or unknown): one owner's answers share half of the
	// client's Budget.
	Owner int
	// Pin holds the socket open for dialling: through the directory the
	// sweep that found it opened (sweep's Socket.Pin), or by its path
	// (sweep.PathPinner); nil: Audit pins Socket by its path.
	Pin func() (sockets.Pinned, error)
	// NotProbed, when set, says why the sweep that found the socket
	// left it unknown for want of time: Audit does not ask it and
	// reports it not audited, rather than leave it out of the report.
	NotProbed string
}

// Supervisor is the audit of one supervisor.
type Supervisor struct {
	Source
	// SessionsTotal is the total /sessions reports; MemoryBytes the sum of
	// every session's sampled memory (candidates or not).
	SessionsTotal int
	MemoryBytes   int64
	// Candidates are the sessions meeting the rule, in the server's order,
	// holding only what the audit reports of them; past the audit's
	// bounds (maxListed, maxListedAll) the rest are only counted, in
	// Unlisted and their memory in UnlistedMemoryBytes.
	Candidates          []kallichore.ActiveSession
	Unlisted            int
	UnlistedMemoryBytes int64
	// Err is set when /sessions could not be read; the rest is then zero.
	Err error
}

// ErrNotAudited is a source's Err when ctx ended before its turn came.
var ErrNotAudited = errors.New("not audited")

// Audit reads /sessions from every source, at most workers at a time, and
// returns one Supervisor per source in the same order. Once ctx ends (a
// deadline: the supervisors' sockets belong to their users, who may make
// every one of them stall to its timeout), the sources still waiting are
// not asked; their Err wraps ErrNotAudited.
func Audit(ctx context.Context, c *kallichore.Client, sources []Source, thresholdSeconds int64, workers int) []Supervisor {
	if c == nil {
		c = kallichore.DefaultClient
	}
	if workers <= 0 {
		workers = 16
	}
	// Sockets named by path: the mount tables are read only if there are
	// any, and once per audit.
	paths := sweep.NewPathPinner("/proc")
	defer paths.Close()
	listed := new(atomic.Int64)
	listed.Store(maxListedAll)
	// Each supervisor's share of the bound, whatever order the audits
	// end in: the first ones (a user's, named to sort first) cannot use
	// up what the others would list.
	share := min(maxListed, max(maxListedAll/max(len(sources), 1), 1))
	out := make([]Supervisor, len(sources))
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, src := range sources {
		// Checked before the select, which picks at random between a
		// free worker and the end.
		if src.NotProbed != "" {
			out[i] = Supervisor{Source: src, Err: fmt.Errorf("%w: its socket was %s", ErrNotAudited, src.NotProbed)}
			continue
		}
		if ctx.Err() != nil {
			out[i] = Supervisor{Source: src, Err: fmt.Errorf("%w: %w", ErrNotAudited, context.Cause(ctx))}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i] = Supervisor{Source: src, Err: fmt.Errorf("%w: %w", ErrNotAudited, context.Cause(ctx))}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = audit(ctx, c, src, thresholdSeconds, paths, share, listed)
		}()
	}
	wg.Wait()
	return out
}

// Bounds on the sessions an audit lists: any user can run a process
// named kcserver whose /sessions lists thousands of idle sessions, and
// every supervisor's are held until the run reports. Past them sessions
// are counted, not listed. Each supervisor lists at most an equal share
// of maxListedAll (and of maxListed).
const (
	maxListed    = 1024 // of one supervisor
	maxListedAll = 8192 // of all, as the audits take them
	// maxShownPath clips a listed session's working directory.
	maxShownPath = 1024
)

func audit(ctx context.Context, c *kallichore.Client, src Source, threshold int64, paths *sweep.PathPinner, share int, listed *atomic.Int64) Supervisor {
	sup := Supervisor{Source: src}
	// Pinned: a socket found by a sweep may have a user's FUSE mount over
	// it or its directory by now; through the sweep's directory nothing
	// is looked up by path, and a path is walked as the sweep walks one.
	var pin sockets.Pinned
	var err error
	if src.Pin != nil {
		pin, err = src.Pin()
	} else {
		pin, err = paths.Pin(src.Socket)
	}
	if err != nil {
		sup.Err = err
		return sup
	}
	defer pin.Release()
	l, err := c.SessionsOf(ctx, kallichore.Socket{Dial: pin.Path, Name: src.Socket, Owner: src.Owner})
	if err != nil {
		sup.Err = err
		return sup
	}
	sup.SessionsTotal = l.Total
	for _, s := range l.Sessions {
		sup.MemoryBytes = kallichore.AddBytes(sup.MemoryBytes, s.MemoryBytes())
		if !IsCandidate(s, threshold) {
			continue
		}
		if len(sup.Candidates) < share && listed.Add(-1) >= 0 {
			sup.Candidates = append(sup.Candidates, reported(s))
			continue
		}
		sup.Unlisted++
		sup.UnlistedMemoryBytes = kallichore.AddBytes(sup.UnlistedMemoryBytes, s.MemoryBytes())
	}
	return sup
}

// reported is what the audit shows of a session. Every supervisor's
// candidates are held until the run reports, and a supervisor may
// describe each session at length (argv, kernel info, prompts).
func reported(s kallichore.ActiveSession) kallichore.ActiveSession {
	return kallichore.ActiveSession{
		SessionID: s.SessionID, Language: s.Language, Status: s.Status, Connected: s.Connected,
		IdleSeconds: s.IdleSeconds, WorkingDirectory: clipPath(s.WorkingDirectory), ResourceUsage: s.ResourceUsage,
	}
}

// clipPath cuts p to maxShownPath bytes, at a character's start, marking
// the cut.
func clipPath(p string) string {
	if len(p) <= maxShownPath {
		return p
	}
	cut := maxShownPath
	for cut > 0 && !utf8.RuneStart(p[cut]) {
		cut--
	}
	return p[:cut] + "…"
}
