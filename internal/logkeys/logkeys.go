// Package logkeys keeps each key once per log line. A logger given a key
// through With (a run's "container", a step's "step") and then the same
// key again, by a later With or on the record, writes it twice; JSON
// readers (jq, most log pipelines) then keep one of the two, of their
// choosing.
package logkeys

import (
	"context"
	"log/slog"
)

// Unique wraps h so that each line carries each key once: the value
// closest to the line wins (the record's over a With's, a later With's
// over an earlier one's). Keys inside a group are the group's own.
func Unique(h slog.Handler) slog.Handler { return &handler{inner: h} }

type handler struct {
	inner slog.Handler
	// attrs are With's, held back from inner until a line shows which
	// of them it overrides.
	attrs []slog.Attr
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	return &handler{inner: h.inner, attrs: merge(h.attrs, as)}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{inner: h.inner.WithAttrs(h.attrs).WithGroup(name)}
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	own := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		own = append(own, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(merge(h.attrs, own)...)
	return h.inner.Handle(ctx, out)
}

// merge is base then more, each key once, at its last value. Attrs
// without a key (an inlined group's) are kept as they are.
func merge(base, more []slog.Attr) []slog.Attr {
	all := append(append(make([]slog.Attr, 0, len(base)+len(more)), base...), more...)
	out := make([]slog.Attr, 0, len(all))
	for i, a := range all {
		if a.Key != "" && laterHas(all[i+1:], a.Key) {
			continue
		}
		out = append(out, a)
	}
	return out
}

func laterHas(as []slog.Attr, key string) bool {
	for _, a := range as {
		if a.Key == key {
			return true
		}
	}
	return false
}
