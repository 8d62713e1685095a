package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns the replica side of a new pseudo-terminal.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return pts
}

// TestStageRefusesTerminalStdin: typed by hand, a stage says what it
// wants instead of waiting silently for a State nobody will type; a pipe
// is read as before.
func TestStageRefusesTerminalStdin(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"kc-hook", "--state-dir", dir, "poststop"}, openPTY(t), &stdout, &stderr)
	if code != exitBadInput || !strings.Contains(stderr.String(), "stdin is a terminal") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("not json")
	w.Close()
	defer r.Close()
	if code := run([]string{"kc-hook", "--state-dir", dir, "poststop"}, r, &stdout, &stderr); code != exitBadInput || strings.Contains(stderr.String(), "terminal") {
		t.Errorf("a pipe: exit %d, stderr %q", code, stderr.String())
	}
}
