package engine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestMessages(t *testing.T) {
	big := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, in string
		want     []string
		tooLarge int
	}{
		{"lines", "a\nb\n", []string{"a", "b"}, 0},
		{"blank lines and no final newline", "\n\na\r\n  \nb", []string{"a", "b"}, 0},
		{"exactly the cap", big[:64] + "\n" + "c\n", []string{big[:64], "c"}, 0},
		{"over the cap, then the next", big[:65] + "\n" + "c\n", []string{"c"}, 1},
		{"over the cap at the end", "c\n" + big, []string{"c"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			m := newMessages(strings.NewReader(tc.in), 64, func(reason string, size int64) {
				if reason == SkipTooLarge {
					n++
				}
			})
			m.r = bufio.NewReaderSize(strings.NewReader(tc.in), 16) // messages span several buffer fills
			var got []string
			for {
				msg, err := m.next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(msg))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || n != tc.tooLarge {
				t.Errorf("got %q and %d too large, want %q and %d", got, n, tc.want, tc.tooLarge)
			}
		})
	}
}

// peakRSS resets this process's peak resident set size (clear_refs 5)
// and returns a function reading it, in bytes.
func peakRSS(t *testing.T) func() int64 {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak RSS: %v", err)
	}
	return func() int64 {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmHWM in /proc/self/status")
		return 0
	}
}

// TestEventMessageCap: Docker's /events and libpod's event stream, served
// on a real unix socket, send a 10 MiB message, then a death, then a
// message that never ends. The death after the big message is reported,
// the big one is counted, the endless one is read and thrown away as it
// comes (the stream is not dropped: a re-subscription would replay it)
// and counted when the stream ends in it,
// and this process stays far below 300 MB however much of it is sent.
func TestEventMessageCap(t *testing.T) {
	id := strings.Repeat("cd", 32)
	const endless = 1 << 30 // what the server sends of the endless message before the test stops it
	for _, eng := range []struct {
		name, path, action string
		new                func(url string) Engine
	}{
		{"docker", "/events", "die", func(u string) Engine { e, _ := newDocker(Config{DockerURL: u}); return e }},
		{"podman", podmanEventsPath, "died", func(u string) Engine { e, _ := newPodman(Config{PodmanURL: u}); return e }},
	} {
		t.Run(eng.name, func(t *testing.T) {
			var sent atomic.Int64
			u, _ := fakeDocker(t, func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, eng.path) {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(http.StatusOK)
				chunk := bytes.Repeat([]byte("a"), 64<<10) // inside a JSON string, no newline: one message goes on
				write := func(b []byte) bool {
					n, err := w.Write(b)
					sent.Add(int64(n))
					return err == nil
				}
				write([]byte(`{"Type":"container","Action":"` + eng.action + `","Actor":{"ID":"`))
				for i := 0; i < 10<<20/len(chunk)+1; i++ {
					write(chunk)
				}
				write([]byte("\"}}\n"))
				write([]byte(fmt.Sprintf(`{"Type":"container","Action":%q,"timeNano":%d,"Actor":{"ID":%q}}`+"\n", eng.action, time.Now().UnixNano(), id)))
				write([]byte(`{"Type":"container","Action":"` + eng.action + `","Actor":{"ID":"`))
				for sent.Load() < endless && write(chunk) {
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			peak := peakRSS(t)
			e := eng.new(u)
			var deaths, tooLarge, tooLargeBefore atomic.Int32
			sctx, stop := context.WithCancel(t.Context())
			defer stop()
			done := make(chan error, 1)
			go func() {
				done <- e.Deaths(sctx, DeathWatch{
					Death: func(d Death) {
						if d.ID == id {
							deaths.Add(1)
							tooLargeBefore.Store(tooLarge.Load())
						}
					},
					Skipped: func(reason string, size int64) {
						if reason == SkipTooLarge {
							tooLarge.Add(1)
						}
					},
				})
			}()
			deadline := time.Now().Add(2 * time.Minute)
			for sent.Load() < endless || deaths.Load() == 0 {
				select {
				case err := <-done:
					t.Fatalf("the stream ended after %d MiB: %v", sent.Load()>>20, err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 2 minutes: %d MiB sent, %d deaths", sent.Load()>>20, deaths.Load())
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Errorf("Deaths after cancel: %v", err)
			}
			p := peak()
			t.Logf("%d MiB sent (a 10 MiB message, a death, an endless message): peak RSS %d MiB", sent.Load()>>20, p>>20)
			// The endless message is counted too once the stream ends in it.
			if deaths.Load() != 1 || tooLargeBefore.Load() != 1 || tooLarge.Load() != 2 {
				t.Errorf("%d deaths, %d messages counted too large before it and %d in all, want 1, 1 and 2", deaths.Load(), tooLargeBefore.Load(), tooLarge.Load())
			}
			if p > 300<<20 {
				t.Errorf("peak RSS %d MiB reading the stream, want < 300 MiB", p>>20)
			}
		})
	}
}
