// Command sockserver is what a hostile user can leave in /tmp for a root
// janitor to probe: many listening kc-<n>.sock sockets that never answer,
// or that answer GET /status and GET /sessions with bodies of any size.
// Tests run it (testutil.StartSockServer), as another user when they can.
//
//	sockserver -dir D -n N -first F [-links] [-size BYTES [-announce]] -ready FILE
//
// Sockets are D/kc-<F>.sock … D/kc-<F+N-1>.sock. With -links, one socket is
// bound and the other names are hard links to it. Without -size the
// sockets listen and never accept: connect(2) succeeds (the backlog takes
// it) and a request waits forever. With -size, every request is answered
// 200 with a JSON object padded to BYTES, chunked unless -announce. Once
// all are in place, FILE is written with "ok".
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() {
	dir := flag.String("dir", "", "socket directory")
	n := flag.Int("n", 1, "number of socket names")
	first := flag.Int("first", 4000000, "number in the first name")
	links := flag.Bool("links", false, "hard-link one socket under every name")
	size := flag.Int("size", 0, "answer with bodies of this size (0: never answer)")
	announce := flag.Bool("announce", false, "send Content-Length")
	ready := flag.String("ready", "", "file written once listening")
	flag.Parse()
	ls, err := run(*dir, *n, *first, *links, *size, *announce, *ready)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockserver:", err)
		os.Exit(1)
	}
	// Listeners that are not referenced are closed by their finalizers,
	// and a main that only blocks is a deadlock to the runtime.
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(ls)
	}
}

func run(dir string, n, first int, links bool, size int, announce bool, ready string) ([]net.Listener, error) {
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("kc-%d.sock", first+i)) }
	var ls []net.Listener
	for i := 0; i < n; i++ {
		if links && i > 0 {
			if err := os.Link(name(0), name(i)); err != nil {
				return nil, err
			}
			continue
		}
		l, err := net.Listen("unix", name(i))
		if err != nil {
			return nil, err
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		ls = append(ls, l)
	}
	if size > 0 {
		for _, l := range ls {
			go http.Serve(l, fat(size, announce))
		}
	}
	return ls, os.WriteFile(ready, []byte("ok"), 0o644)
}

// fat answers /status and /sessions with valid JSON of size bytes, padded
// with a field nobody reads.
func fat(size int, announce bool) http.HandlerFunc {
	chunk := strings.Repeat("a", 64<<10)
	return func(w http.ResponseWriter, r *http.Request) {
		head := `{"process_id":1,"pad":"`
		if r.URL.Path == "/sessions" {
			head = `{"total":0,"sessions":[],"pad":"`
		}
		const tail = `"}`
		if announce {
			w.Header().Set("Content-Length", fmt.Sprint(size))
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, head)
		for left := size - len(head) - len(tail); left > 0; {
			m, err := io.WriteString(w, chunk[:min(left, len(chunk))])
			if err != nil {
				return
			}
			left -= m
		}
		io.WriteString(w, tail)
	}
}
