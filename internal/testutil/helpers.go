package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// WriteFile writes data to path with mode, failing the test if it cannot.
func WriteFile(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

// PathExists reports whether p names anything, a dangling symlink
// included (Lstat, never following it).
func PathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// RandomHex returns digits random lowercase hex digits (64: a container
// ID no engine has).
func RandomHex(t testing.TB, digits int) string {
	t.Helper()
	b := make([]byte, (digits+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:digits]
}

// ReadPID returns the PID a test's child wrote to path.
func ReadPID(t testing.TB, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// WaitStopped polls until pid no longer runs and reports whether that
// happened within d. A zombie counts as stopped: a killed orphan stays
// PID 1's zombie until PID 1 reaps it, which can take seconds.
func WaitStopped(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); fingerprint.Running(fingerprint.DefaultRoot, pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// NotBlockedBy runs f and fails the test if f has not returned within
// 10 s: code that opens fifo (a FIFO no one else opens) blocking waits
// for the other end for ever. fifo is then opened for reading and
// writing, which never blocks and lets a waiting open of either end
// return, so that f ends before the test does.
func NotBlockedBy(t testing.TB, fifo string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return
	case <-time.After(10 * time.Second):
	}
	if fd, err := unix.Open(fifo, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(fd)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	t.Fatalf("still waiting after 10 s: the FIFO %s was opened blocking", fifo)
}
