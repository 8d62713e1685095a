// Package testkit holds helpers shared by kc-watchman's tests: building and
// running the fake Kallichore supervisor (./kcserver).
package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// KCServerPackage is the import path of the fake supervisor.
const KCServerPackage = "github.com/kc-watchman/kc-watchman/internal/testkit/kcserver"

// BuildKCServer builds the fake supervisor (package ./kcserver) as a
// binary named exactly "kcserver", so that the processes it runs have comm
// "kcserver" (see Build).
func BuildKCServer(t testing.TB) string {
	t.Helper()
	return Build(t, KCServerPackage, "kcserver")
}

// KCServer is a running fake supervisor started by StartKCServer.
type KCServer struct {
	PID    int    // the fake's pid
	Dir    string // its --socket-dir
	Socket string // its control socket, Dir/kc-<PID>.sock
	Cmd    *exec.Cmd
	// Children are the identities of the fake's direct children, read once
	// it was ready.
	Children []fingerprint.Stat

	exited chan struct{}
	stderr *lockedBuffer
	mu     sync.Mutex
	err    error
}

// Stderr returns what the fake has written to its stderr so far.
func (k *KCServer) Stderr() string { return k.stderr.String() }

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartKCServer builds (once) and starts the fake with --socket-dir dir,
// a ready file, and the extra args (e.g. "--children=2", "--hang"), and
// waits until it listens. Cleanup SIGKILLs the fake and each recorded
// child by PID (after re-checking its start time) unless already gone.
func StartKCServer(t testing.TB, dir string, args ...string) *KCServer {
	t.Helper()
	bin := BuildKCServer(t)
	ready := filepath.Join(t.TempDir(), "ready")
	argv := append([]string{"--socket-dir=" + dir, "--ready-file=" + ready}, args...)
	cmd := exec.Command(bin, argv...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fake kcserver: %v", err)
	}
	k := &KCServer{PID: cmd.Process.Pid, Dir: dir, Cmd: cmd, exited: make(chan struct{}), stderr: stderr}
	k.Socket = filepath.Join(dir, fmt.Sprintf("kc-%d.sock", k.PID))
	go func() {
		err := cmd.Wait()
		k.mu.Lock()
		k.err = err
		k.mu.Unlock()
		close(k.exited)
	}()
	t.Cleanup(k.cleanup)

	deadline := time.Now().Add(15 * time.Second)
	for {
		if data, err := os.ReadFile(ready); err == nil && strings.TrimSpace(string(data)) == strconv.Itoa(k.PID) {
			break
		}
		select {
		case <-k.exited:
			t.Fatalf("fake kcserver exited before it was ready: %v: %s", k.exitErr(), stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake kcserver not ready after 15s: %s", stderr.String())
		}
	}
	k.Children = childrenOf(k.PID)
	return k
}

// childrenOf lists the live direct children of pid.
func childrenOf(pid int) []fingerprint.Stat {
	ents, _ := os.ReadDir("/proc")
	var out []fingerprint.Stat
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, n)
		if err == nil && st.PPID == pid && !st.Zombie() {
			out = append(out, st)
		}
	}
	return out
}

func (k *KCServer) exitErr() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Exited is closed once the fake has exited (and been waited for).
func (k *KCServer) Exited() <-chan struct{} { return k.exited }

// Signal sends sig to the fake (by its PID, only while it has not been
// waited for, so the number cannot have been recycled).
func (k *KCServer) Signal(sig syscall.Signal) error {
	select {
	case <-k.exited:
		return os.ErrProcessDone
	default:
	}
	return k.Cmd.Process.Signal(sig)
}

// Kill SIGKILLs the fake and waits until it has exited. Its sockets stay
// behind and its children live on, as with a real supervisor.
func (k *KCServer) Kill(t testing.TB) {
	t.Helper()
	k.Signal(syscall.SIGKILL)
	k.Wait(t)
}

// Wait waits (up to 15s) for the fake to exit.
func (k *KCServer) Wait(t testing.TB) {
	t.Helper()
	select {
	case <-k.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("fake kcserver %d did not exit", k.PID)
	}
}

func (k *KCServer) cleanup() {
	k.Signal(syscall.SIGKILL)
	<-k.exited
	for _, c := range k.Children {
		if fingerprint.Alive(fingerprint.DefaultRoot, c) {
			syscall.Kill(c.PID, syscall.SIGKILL)
		}
	}
}
