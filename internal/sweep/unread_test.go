package sweep

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/kallichore"
)

// TestStatusGateSilenceIsNoAnswer: gate 3 calls a server dead on two
// tries that got no answer only. An answer over /status's cap, or one
// that could not be held beside the others being read, came from
// something that listens: unknown, worded as what it was, never "silent".
func TestStatusGateSilenceIsNoAnswer(t *testing.T) {
	on := func(err error) error { return fmt.Errorf("GET /status on /tmp/kc-7.sock: %w", err) }
	tests := []struct {
		name   string
		err    error
		want   say
		reason string
	}{
		{"refused", on(syscall.ECONNREFUSED), sayStale, "silent twice: connection refused"},
		{"over the cap", on(fmt.Errorf("%w: answer over 1048576 bytes", kallichore.ErrTooLarge)), sayUnsure, "not Kallichore: answer too large"},
		{"no room to read it", on(fmt.Errorf("%w: 65536 bytes read", kallichore.ErrNoRoom)), sayUnsure, "not read: answer larger than the memory left"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			try := statusTryOf(0, tt.err)
			got, why := statusGate(7, try, try)
			if got != tt.want || !strings.Contains(why, tt.reason) {
				t.Errorf("statusGate = %v, %q; want %v with %q", got, why, tt.want, tt.reason)
			}
		})
	}

	t.Run("a real answer over the cap", func(t *testing.T) {
		path := filepath.Join(shortTemp(t), "kc-7.sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"process_id": 7, "pad": "%s"}`, strings.Repeat("x", kallichore.MaxStatusBody))
		})}
		go srv.Serve(l) //nolint:errcheck // closed below
		t.Cleanup(func() { srv.Close() })
		c := &kallichore.Client{DialTimeout: time.Second, Timeout: 5 * time.Second}
		try := tryStatus(context.Background(), c, kallichore.Socket{Dial: path, Name: path})
		if got, why := statusGate(7, try, try); got != sayUnsure || !strings.Contains(why, "not Kallichore") {
			t.Errorf("statusGate = %v, %q; want unsure: something answers", got, why)
		}
	})
}
