package kallichore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fatServer answers every request with a JSON object padded to size
// bytes, announcing its length or not (chunked).
func fatServer(t *testing.T, size int, announce bool) string {
	t.Helper()
	return serve(t, func(w http.ResponseWriter, r *http.Request) {
		head := `{"process_id":1,"pad":"`
		if r.URL.Path == "/sessions" {
			head = `{"total":0,"sessions":[],"pad":"`
		}
		tail := `"}`
		if announce {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		w.WriteHeader(200)
		io.WriteString(w, head)
		chunk := strings.Repeat("a", 64<<10)
		for left := size - len(head) - len(tail); left > 0; {
			m, err := io.WriteString(w, chunk[:min(left, len(chunk))])
			if err != nil {
				return // the client stopped reading
			}
			left -= m
		}
		io.WriteString(w, tail)
	})
}

// TestBodyCaps: no answer over its cap (1 MiB for /status, 16 MiB for
// /sessions) is read, announced or not, and one under it is decoded.
func TestBodyCaps(t *testing.T) {
	c := &Client{Timeout: 20 * time.Second}
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		size     int
		announce bool
		ask      func(string) error
		wantErr  bool
	}{
		{"status at the cap, chunked", MaxStatusBody, false, func(p string) error { _, err := c.Status(ctx, p); return err }, false},
		{"status over the cap, chunked", 32 << 20, false, func(p string) error { _, err := c.Status(ctx, p); return err }, true},
		{"status over the cap, announced", 32 << 20, true, func(p string) error { _, err := c.Status(ctx, p); return err }, true},
		{"sessions under the cap", 8 << 20, true, func(p string) error { _, err := c.Sessions(ctx, p); return err }, false},
		{"sessions over the cap, chunked", 32 << 20, false, func(p string) error { _, err := c.Sessions(ctx, p); return err }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.ask(fatServer(t, tt.size, tt.announce))
			if !tt.wantErr {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "answer over ") {
				t.Fatalf("err %v, want ErrTooLarge naming the cap", err)
			}
			if !Answered(err) {
				t.Errorf("an answer over the cap is an answer: asking again would get it again")
			}
		})
	}
}

// TestBudget: a slow answer holds what has come of it while it is read,
// whatever length it announces, so one that sends a little and stalls
// does not hold the budget up (announcing its cap, it held all of it
// until its timeout); an answer that needs more than is free finds no
// room, and is read once the slow one is done.
func TestBudget(t *testing.T) {
	// A read holds, besides what came, up to chargeChunk ahead of it.
	const budget = 4 * chargeChunk
	for _, tc := range []struct {
		name     string
		announce int // the slow answer's Content-Length; 0: chunked
		quick    int // the bytes of the second answer's padding
		wait     bool
	}{
		{"announced: holds what came, the second reads", 3 * chargeChunk, 32 << 10, false},
		{"announced as the whole budget: the second reads", budget, 32 << 10, false},
		{"chunked: holds what came, the second reads", 0, 32 << 10, false},
		{"the second needs more than is free: no room", 0, budget, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold := make(chan struct{})
			started := make(chan struct{}, 1)
			slow := serve(t, func(w http.ResponseWriter, r *http.Request) {
				body := `{"process_id":1,"pad":"` + strings.Repeat("a", max(0, tc.announce-26)) + `"}`
				if tc.announce > 0 {
					w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				}
				w.WriteHeader(200)
				io.WriteString(w, body[:16])
				w.(http.Flusher).Flush()
				started <- struct{}{}
				<-hold
				io.WriteString(w, body[16:])
			})
			quickBody := `{"process_id":2,"pad":"` + strings.Repeat("b", tc.quick) + `"}`
			quick := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(quickBody)))
				io.WriteString(w, quickBody)
			})
			c := &Client{Timeout: 10 * time.Second, Budget: NewBudget(budget)}
			done := make(chan error, 1)
			go func() { _, err := c.Status(context.Background(), slow); done <- err }()
			<-started
			// The server having written is not the client holding its
			// share: wait until the slow read holds some of the budget.
			for deadline := time.Now().Add(5 * time.Second); c.Budget.sem.TryAcquire(budget); {
				c.Budget.sem.Release(budget)
				if time.Now().After(deadline) {
					t.Fatal("the slow read never took its share of the budget")
				}
				time.Sleep(time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			st, err := c.Status(ctx, quick)
			switch {
			case tc.wait && !errors.Is(err, ErrNoRoom) && (err == nil || !strings.Contains(err.Error(), "waiting for memory")):
				t.Errorf("err %v, want no room in the budget while the slow answer holds some", err)
			case !tc.wait && (err != nil || st.ProcessID != 2):
				t.Errorf("%+v, %v; want the answer while the slow one stalls", st, err)
			}
			close(hold)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if st, err := c.Status(context.Background(), quick); err != nil || st.ProcessID != 2 {
				t.Fatalf("after the slow answer: %+v, %v", st, err)
			}
			if !c.Budget.sem.TryAcquire(budget) {
				t.Fatal("the budget was not all given back")
			}
		})
	}
}

// TestBudgetNoHoldAndWait: two answers that announce no length are read
// at once and together outgrow the budget halfway. Neither waits for the
// other while holding its half (each would until its timeout): one gives
// up with ErrNoRoom, its bytes given back, and the other is read whole —
// or, when both find no room at the same moment, both give up (each is
// asked again once, with Client.RetryAfter).
func TestBudgetNoHoldAndWait(t *testing.T) {
	const budget, half = 64 << 10, 24 << 10
	c := &Client{Timeout: 20 * time.Second, Budget: NewBudget(budget)}
	var arrived sync.WaitGroup
	arrived.Add(2)
	both := make(chan struct{})
	answer := func(w http.ResponseWriter, _ *http.Request) {
		body := `{"process_id":1,"pad":"` + strings.Repeat("a", 2*half) + `"}`
		w.WriteHeader(200)
		io.WriteString(w, body[:half])
		w.(http.Flusher).Flush()
		arrived.Done()
		<-both
		io.WriteString(w, body[half:])
	}
	socks := []string{serve(t, answer), serve(t, answer)}
	errs := make(chan error, 2)
	for _, s := range socks {
		go func() { _, err := c.Status(context.Background(), s); errs <- err }()
	}
	arrived.Wait()
	// Both first halves in hand: more than half the budget held.
	for deadline := time.Now().Add(5 * time.Second); c.Budget.sem.TryAcquire(budget - 2*half + 1); {
		c.Budget.sem.Release(budget - 2*half + 1)
		if time.Now().After(deadline) {
			t.Fatal("the two answers never held their first halves")
		}
		time.Sleep(time.Millisecond)
	}
	close(both)
	var read, noRoom int
	for range 2 {
		select {
		case err := <-errs:
			switch {
			case err == nil:
				read++
			case errors.Is(err, ErrNoRoom):
				noRoom++
			default:
				t.Errorf("answer: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an answer waits while holding part of the budget")
		}
	}
	if noRoom < 1 || read+noRoom != 2 {
		t.Errorf("%d read, %d out of room; want at least one out of room, none waiting", read, noRoom)
	}
	if !c.Budget.sem.TryAcquire(budget) {
		t.Error("the budget was not all given back")
	}
}

// TestBudgetOwnersShareHalf: one owner's answers hold at most half of the
// budget together. A user whose supervisors send large answers and stall
// leaves the other half to other users' answers, which read at once; an
// owner's answer over that half alone is refused.
func TestBudgetOwnersShareHalf(t *testing.T) {
	const size = 1 << 20
	read := func(b *Budget, owner, n int, ctx context.Context) (*chargedReader, error) {
		r := &chargedReader{ctx: ctx, r: bytes.NewReader(make([]byte, n)), b: b, own: b.ownerShare(owner)}
		_, err := io.ReadFull(r, make([]byte, n))
		return r, err
	}
	// What the client's decoder gets back (readError), unwrapped.
	noRoom := func(err error) bool {
		re := (*readError)(nil)
		return errors.As(err, &re) && errors.Is(re.err, ErrNoRoom)
	}
	b := NewBudget(size)
	held, err := read(b, 1000, 400<<10, t.Context())
	if err != nil {
		t.Fatalf("the user's first answer: %v", err)
	}
	defer held.release()
	second, err := read(b, 1000, 600<<10, t.Context())
	second.release()
	if !noRoom(err) {
		t.Errorf("the same user's second answer: %v, want ErrNoRoom (past his half)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	other, err := read(b, 1001, 400<<10, ctx)
	other.release()
	if err != nil {
		t.Errorf("another user's answer: %v, want it read while the first user's stall", err)
	}
	alone, err := read(NewBudget(size), 1000, size/2+1, t.Context())
	alone.release()
	if !noRoom(err) {
		t.Errorf("one owner's answer over half the budget: %v, want ErrNoRoom", err)
	}
	// Root's sockets (owner 0) are bounded by the budget alone.
	root, err := read(NewBudget(size), 0, size/2+1, t.Context())
	root.release()
	if err != nil {
		t.Errorf("root's answer over half the budget: %v, want it read", err)
	}
}
