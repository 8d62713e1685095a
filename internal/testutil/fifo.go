package testutil

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// OnFIFORead makes path a FIFO and, once the code under test opens it to
// read, calls fill with its write end, then closes it: what fill does
// happens exactly between the reader's open and its end of file (a
// process recycled, moved, swapped between two reads). The returned wait
// fails the test if fill failed, or if nothing opened the FIFO within
// 10 s; a writer still waiting when the test ends is freed.
func OnFIFORead(t testing.TB, path string, fill func(w *os.File) error) (wait func()) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(path, os.O_WRONLY, 0) // until a reader opens it
		if err != nil {
			done <- err
			return
		}
		defer w.Close()
		done <- fill(w)
	}()
	t.Cleanup(func() {
		if r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
			r.Close()
		}
	})
	return func() {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing read %s", path)
		}
	}
}
