package sweep

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// orphanSocket creates a socket file at dir/name with nothing listening:
// what a SIGKILLed server leaves behind.
func orphanSocket(t testing.TB, dir, name string) string { return testutil.OrphanSocket(t, dir, name) }

// listenSocket creates a socket at dir/name that this test process
// listens on until the test ends.
func listenSocket(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, l)
	return p
}

// startSleep starts a `sleep` (a live process that is not a supervisor)
// and kills it by PID when the test ends.
func startSleep(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("sleep", "1000000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// threadID returns the ID of a thread of this test process that is not
// the thread-group leader.
func threadID(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if tid, _ := strconv.Atoi(e.Name()); tid != 0 && tid != os.Getpid() {
			return tid
		}
	}
	t.Skip("test process has a single thread")
	return 0
}

// waitDead polls until pid is gone or a zombie.
func waitDead(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, pid)
		if err != nil || st.Zombie() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fastConfig(dirs ...string) Config {
	return Config{
		Dirs:        dirs,
		DialTimeout: 200 * time.Millisecond,
		Timeout:     500 * time.Millisecond,
		Pause:       50 * time.Millisecond,
	}
}

func sweep(t testing.TB, cfg Config) map[string]*Socket {
	t.Helper()
	rep, err := Sweep(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rep.DirErrors {
		t.Errorf("dir error: %v", e)
	}
	out := map[string]*Socket{}
	for _, s := range rep.Sockets {
		out[s.Path] = s
	}
	return out
}

func killPID(pid int) { syscall.Kill(pid, syscall.SIGKILL) }
