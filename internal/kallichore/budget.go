package kallichore

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// DefaultBudget is the bytes of answers a janitor reads at once, across
// every probe and audit sharing a Budget: 16 status answers at their cap,
// or one sessions answer. An answer weighs what it announces (Kallichore
// announces a few hundred bytes), else its cap. Decoding holds several
// times what is read (the decoder's buffer grows by doubling, then the
// values decoded), so this keeps a run near 150 MiB whatever the sockets
// in /tmp serve (cull of 32 supervisors serving 32 MiB: 157 MiB peak RSS;
// with 64 MiB it was 261 MiB).
const DefaultBudget = 16 << 20

// Budget bounds the bytes of answers being read at once by the clients
// sharing it. A nil *Budget bounds nothing.
type Budget struct {
	sem  *semaphore.Weighted
	size int64
}

// NewBudget returns a budget of size bytes (DefaultBudget if size <= 0).
func NewBudget(size int64) *Budget {
	if size <= 0 {
		size = DefaultBudget
	}
	return &Budget{sem: semaphore.NewWeighted(size), size: size}
}

// acquire waits until n bytes are free (all of it, if n is more than the
// whole budget: one answer at a time) or ctx ends.
func (b *Budget) acquire(ctx context.Context, n int64) (release func(), err error) {
	if b == nil {
		return func() {}, nil
	}
	n = max(1, min(n, b.size))
	if err := b.sem.Acquire(ctx, n); err != nil {
		return nil, err
	}
	return func() { b.sem.Release(n) }, nil
}
