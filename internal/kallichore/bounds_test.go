package kallichore

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
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
			if !answered(err) {
				t.Errorf("an answer over the cap is an answer: asking again would get it again")
			}
		})
	}
}

// TestBudget: with a budget, an answer waits for the bytes that others
// are reading to be released; without the budget's room it never starts
// reading, and once the first answer is done it can.
func TestBudget(t *testing.T) {
	hold := make(chan struct{})
	started := make(chan struct{}, 1)
	slow := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(`{"process_id":1}`)))
		w.WriteHeader(200)
		io.WriteString(w, `{"process_id"`)
		w.(http.Flusher).Flush()
		started <- struct{}{}
		<-hold
		io.WriteString(w, `:1}`)
	})
	quick := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // chunked: no length announced
		io.WriteString(w, `{"process_id":2}`)
	})
	c := &Client{Timeout: 10 * time.Second, Budget: NewBudget(64 << 10)}
	done := make(chan error, 1)
	go func() { _, err := c.Status(context.Background(), slow); done <- err }()
	<-started
	// The server having written is not the client holding its share:
	// wait until the slow read has taken its bytes of the budget.
	for deadline := time.Now().Add(5 * time.Second); c.Budget.sem.TryAcquire(c.Budget.size); {
		c.Budget.sem.Release(c.Budget.size)
		if time.Now().After(deadline) {
			t.Fatal("the slow read never took its share of the budget")
		}
		time.Sleep(time.Millisecond)
	}
	// The quick answer is chunked: it weighs the whole /status cap, more
	// than the 64 KiB budget, so it must wait for all of it.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Status(ctx, quick); err == nil || !strings.Contains(err.Error(), "waiting for memory") {
		t.Fatalf("err %v, want a wait for the budget cut by the deadline", err)
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, err := c.Status(context.Background(), quick); err != nil || st.ProcessID != 2 {
		t.Fatalf("after the budget was released: %+v, %v", st, err)
	}
}
