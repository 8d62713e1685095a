package kallichore

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sync/semaphore"
)

// DefaultBudget is the bytes of answers a janitor reads at once, across
// every probe and audit sharing a Budget: 16 status answers at their cap,
// or one sessions answer. An answer weighs what has come of it
// (Kallichore's are a few hundred bytes), whatever length it announces.
// Decoding holds several times what is read (the decoder's buffer grows
// by doubling, then the values decoded), so this keeps a run near 150 MiB whatever the sockets
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

// chargeChunk is the most a chargedReader takes of the budget ahead of
// one read.
const chargeChunk = 64 << 10

// chargedReader charges b for an answer as it arrives, so a server that
// sends headers (announcing any length) and stalls holds what it sent,
// not the budget every other answer waits for. Each read takes up to chargeChunk ahead and gives back what did
// not come; one answer holds at most the whole budget (then it reads on
// uncharged, as one answer at a time would).
//
// Only an answer that holds nothing waits for the budget: one that has
// some and cannot have more at once gives up (ErrNoRoom), so that answers
// never hold parts of the budget while each waits for the others'.
type chargedReader struct {
	ctx  context.Context
	r    io.Reader
	b    *Budget
	held int64
}

func (c *chargedReader) Read(p []byte) (int, error) {
	if c.b == nil {
		return c.r.Read(p)
	}
	want := min(int64(len(p)), chargeChunk, c.b.size-c.held)
	if want > 0 {
		p = p[:want]
		if c.held == 0 {
			if err := c.b.sem.Acquire(c.ctx, want); err != nil {
				return 0, &readError{fmt.Errorf("waiting for memory to read the answer in: %w", err)}
			}
		} else if !c.b.sem.TryAcquire(want) {
			return 0, &readError{fmt.Errorf("%w: %d bytes read, other answers hold the rest of the %d MiB budget", ErrNoRoom, c.held, c.b.size>>20)}
		}
	}
	n, err := c.r.Read(p)
	if want > 0 {
		c.b.sem.Release(want - int64(n))
		c.held += int64(n)
	}
	return n, err
}

// release gives back what the answer held.
func (c *chargedReader) release() {
	if c.b != nil && c.held > 0 {
		c.b.sem.Release(c.held)
		c.held = 0
	}
}
