package kallichore

import (
	"context"
	"fmt"
	"io"
	"sync"

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
//
// The answers from one owner's sockets (Socket.Owner) hold at most half
// of it together: a user whose supervisors send huge answers and stall
// leaves the other half to everyone else's, who would otherwise wait
// out their timeouts and be reported unreadable.
type Budget struct {
	sem  *semaphore.Weighted
	size int64

	mu     sync.Mutex
	owners map[int]*semaphore.Weighted
}

// ownerShare returns the semaphore of owner's half of b (nil: none).
func (b *Budget) ownerShare(owner int) *semaphore.Weighted {
	if b == nil || owner == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.owners == nil {
		b.owners = map[int]*semaphore.Weighted{}
	}
	s := b.owners[owner]
	if s == nil {
		s = semaphore.NewWeighted(b.size / 2)
		b.owners[owner] = s
	}
	return s
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
// never hold parts of the budget while each waits for the others'. An
// answer of an owner's (own set) is charged to the owner's half too, and
// one larger than that half alone is refused (ErrNoRoom).
type chargedReader struct {
	ctx  context.Context
	r    io.Reader
	b    *Budget
	own  *semaphore.Weighted
	held int64
}

func (c *chargedReader) Read(p []byte) (int, error) {
	if c.b == nil {
		return c.r.Read(p)
	}
	want := min(int64(len(p)), chargeChunk, c.b.size-c.held)
	if c.own != nil {
		if c.held >= c.b.size/2 {
			return 0, &readError{fmt.Errorf("%w: an answer over half the %d MiB budget from one owner's socket", ErrNoRoom, c.b.size>>20)}
		}
		want = min(want, c.b.size/2-c.held)
	}
	if want > 0 {
		p = p[:want]
		if err := c.acquire(want); err != nil {
			return 0, err
		}
	}
	n, err := c.r.Read(p)
	if want > 0 {
		c.give(want - int64(n))
		c.held += int64(n)
	}
	return n, err
}

// acquire takes n bytes of the owner's half (if any), then of the budget.
func (c *chargedReader) acquire(n int64) error {
	if c.held == 0 {
		if c.own != nil {
			if err := c.own.Acquire(c.ctx, n); err != nil {
				return &readError{fmt.Errorf("waiting for memory to read the answer in (its owner's other answers hold half the budget): %w", err)}
			}
		}
		if err := c.b.sem.Acquire(c.ctx, n); err != nil {
			if c.own != nil {
				c.own.Release(n)
			}
			return &readError{fmt.Errorf("waiting for memory to read the answer in: %w", err)}
		}
		return nil
	}
	if c.own != nil && !c.own.TryAcquire(n) {
		return &readError{fmt.Errorf("%w: %d bytes read, its owner's other answers hold the rest of half the %d MiB budget", ErrNoRoom, c.held, c.b.size>>20)}
	}
	if !c.b.sem.TryAcquire(n) {
		if c.own != nil {
			c.own.Release(n)
		}
		return &readError{fmt.Errorf("%w: %d bytes read, other answers hold the rest of the %d MiB budget", ErrNoRoom, c.held, c.b.size>>20)}
	}
	return nil
}

// give returns n bytes to the budget and the owner's half.
func (c *chargedReader) give(n int64) {
	if n <= 0 {
		return
	}
	c.b.sem.Release(n)
	if c.own != nil {
		c.own.Release(n)
	}
}

// release gives back what the answer held.
func (c *chargedReader) release() {
	if c.b != nil && c.held > 0 {
		c.give(c.held)
		c.held = 0
	}
}
