package supervise

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/contain"
	"github.com/kc-watchman/kc-watchman/internal/ledger"
	"github.com/kc-watchman/kc-watchman/internal/testutil"
)

// failingScoper stands for a systemd that will not start the command's
// scope (another wrapper's unit of the same name, a D-Bus timeout) and
// records what it is asked.
type failingScoper struct {
	mu    sync.Mutex
	calls []string
}

func (f *failingScoper) StartScope(_ context.Context, unit, _ string, _ int) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "start "+unit)
	return "", errors.New("unit " + unit + " already exists")
}

func (f *failingScoper) StopScope(_ context.Context, unit string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "stop "+unit)
	return nil
}

func (f *failingScoper) Close() error { return nil }

// TestScopeNotEnteredIsNeverSwept: a command its scope could not be
// started for runs uncontained, and the wrapper then never sweeps or
// stops that scope: a unit of that name may be another wrapper's, and
// what a cgroup it never entered holds is not its tree. A process in the
// cgroup such a scope would have lives on.
func TestScopeNotEnteredIsNeverSwept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	real := contain.Detect(contain.Options{})
	if real.Kind != contain.KindCgroup2 {
		t.Skipf("no cgroup v2 to stand in for systemd's: %s", real.Why)
	}
	f := &failingScoper{}
	h := contain.Detect(contain.Options{SystemdMarker: t.TempDir(), Systemd: func(context.Context) (contain.Scoper, error) { return f, nil }})
	if h.Kind != contain.KindSystemd {
		t.Fatalf("Detect = %s (%s), want systemd", h.Kind, h.Why)
	}
	id := testutil.RandomHex(t, 64)
	cg, err := contain.Prepare(context.Background(), h, id, os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	// The scope's cgroup as another wrapper's unit would have it, with a
	// process in it.
	scope := filepath.Join(real.Mount, contain.SlicePath, contain.UnitName(id))
	if err := os.MkdirAll(scope, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for d := scope; d != real.Mount; d = filepath.Dir(d) {
			os.Remove(d) // kc.slice/kc-watchman.slice/<unit>, inside out
		}
	})
	other := startIn(t, scope)

	var logs strings.Builder
	r := &runner{o: Options{Spec: Spec{ContainerID: id, Command: []string{"sleep", "1000"}}}.withDefaults(), log: slog.New(slog.NewTextHandler(&logs, nil)), cg: cg}
	c, err := r.startChild()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Kill() //nolint:errcheck // it may be gone
		<-c.exited
		c.reap()
	})
	if r.cg != nil || !strings.Contains(logs.String(), "runs uncontained") {
		t.Fatalf("the command's cgroup is kept after its scope failed to start; log:\n%s", logs.String())
	}
	r.sweep(false)
	f.mu.Lock()
	calls := strings.Join(f.calls, ", ")
	f.mu.Unlock()
	if calls != "start "+contain.UnitName(id) {
		t.Errorf("scoper calls %q, want only the failed start", calls)
	}
	// A sweep waits for what it kills: one that had touched the scope
	// would have left it dead by now.
	select {
	case <-other.exited:
		t.Error("the process in the scope's cgroup was killed")
	default:
	}
	if _, err := os.Stat(scope); err != nil {
		t.Errorf("the scope's cgroup: %v", err)
	}
}

// inCgroup is a process started straight into a cgroup.
type inCgroup struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startIn starts sleep in the cgroup directory dir; cleanup kills it
// before the cgroup is removed.
func startIn(t *testing.T, dir string) *inCgroup {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	p := &inCgroup{cmd: exec.Command("sleep", "1000"), exited: make(chan struct{})}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()          //nolint:errcheck // exited is what is read
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.exited }) //nolint:errcheck // it may be gone
	return p
}

// TestSweepOfAScopeNeverEntered: a systemd scope the command never entered
// (the command never started) is not swept, and not recorded: a record of
// a scope with no cgroup would be refused, and said so, by every later
// reap of the container.
func TestSweepOfAScopeNeverEntered(t *testing.T) {
	store, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("4e", 32)
	var logs strings.Builder
	o := Options{Spec: Spec{ContainerID: id, Command: []string{"/nonexistent"}}, Store: store}.withDefaults()
	r := &runner{o: o, log: slog.New(slog.NewTextHandler(&logs, nil)), cg: &contain.Cgroup{Kind: contain.KindSystemd, Unit: contain.UnitName(id)}}
	r.sweep(false)
	if rec, err := store.Load(id); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("record %+v, %v; want none written", rec, err)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("an error logged for a scope never entered:\n%s", logs.String())
	}
}
