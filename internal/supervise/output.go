package supervise

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// DefaultOutputCap bounds the supervisor's log file (stdout and stderr,
// where kc-hook launches it: the state dir, often a tmpfs). What a
// supervisor writes is its kernels' doing too, and a kernel that prints
// without end must not fill the host's memory or disk.
const DefaultOutputCap = 4 << 20

// capOutput routes the command's output through a pipe into f, which is
// emptied (and says so) whenever one more write would take it past max,
// so that it holds the most recent output and never much more than max.
// It applies to a regular file only (a terminal or a pipe is the
// caller's to bound); the returned writer is the command's stdout and
// stderr, and stop, once the command is gone, waits for the copy to end.
func capOutput(f *os.File, max int64) (w *os.File, stop func(), err error) {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || max <= 0 {
		return f, func() {}, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return f, func() {}, fmt.Errorf("output pipe: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer pr.Close()
		io.Copy(&cappedFile{f: f, max: max}, pr) //nolint:errcheck // ends when every writer is gone
	}()
	return pw, func() {
		pw.Close()
		// A descendant that escaped the teardown may still hold the
		// pipe: the copy is not waited for beyond a moment.
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}, nil
}

// cappedFile empties f before a write that would take it past max. The
// size is f's own (the wrapper's log lines share the file).
//
// A write that fails (a full tmpfs) loses its bytes and never fails the
// copy: stopping it would close the pipe, and the supervisor and its
// kernels would die of EPIPE at their next print. The loss is noted in
// the file once it takes writes again.
type cappedFile struct {
	f   *os.File
	max int64
	// lost counts the bytes dropped since the last note; why is the
	// first failure's error.
	lost int64
	why  error
}

func (c *cappedFile) Write(p []byte) (int, error) {
	n := len(p)
	if st, err := c.f.Stat(); err == nil && st.Size()+int64(n) > c.max {
		if err := c.f.Truncate(0); err == nil {
			// Opened without O_APPEND (a shell's >), the offset would
			// stay where it was.
			c.f.Seek(0, io.SeekStart) //nolint:errcheck // O_APPEND writes at the end anyway
			fmt.Fprintf(c.f, "kc-hook supervise: output over %d bytes; the log was emptied at %s\n", c.max, time.Now().UTC().Format(time.RFC3339))
		}
		if keep := c.max / 2; int64(len(p)) > keep {
			p = p[int64(len(p))-keep:]
		}
	}
	if c.lost > 0 {
		if _, err := fmt.Fprintf(c.f, "kc-hook supervise: %d bytes of output were lost: %v\n", c.lost, c.why); err != nil {
			c.lost += int64(n)
			return n, nil
		}
		c.lost, c.why = 0, nil
	}
	if w, err := c.f.Write(p); err != nil {
		if c.lost == 0 {
			c.why = err
		}
		c.lost += int64(len(p) - w)
	}
	return n, nil
}

// sameFile reports whether a and b are one open file.
func sameFile(a, b *os.File) bool {
	sa, err := a.Stat()
	if err != nil {
		return false
	}
	sb, err := b.Stat()
	return err == nil && os.SameFile(sa, sb)
}
