//go:build reliability

package reliability

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// gatedProc is a procfs view, for pgkill.Options.Root, in which every read
// of a recorded member's /proc/<pid>/stat blocks until the test lets it
// through. pgkill re-reads a member's identity before each decision (pin,
// after SIGSTOP, every liveness poll), so each such read is a point where
// a race can fall; the test may change the world (kill the member, hand
// its PID to an innocent) right before the read returns, and the read then
// returns what the real /proc says at that moment. Everything else —
// pidfd_open, pidfd_send_signal, kill(2) — is real.
//
// Layout: root/<pid> is a symlink, to a gate directory while the recorded
// member lives (stat: a FIFO served by a goroutine; status: a symlink to
// /proc/<pid>/status), and to /proc/<pid> itself once the member is dead
// (so later reads see ENOENT, a zombie, or whoever took the PID).
type gatedProc struct {
	root  string
	gates []*gate
	// onRead runs before each gated read is answered, serialised.
	onRead func(pid int)
	mu     sync.Mutex
	reads  atomic.Int64
}

type gate struct {
	gp   *gatedProc
	rec  fingerprint.Stat
	link string // root/<pid>
	dir  string // the gate directory
	stop atomic.Bool
	done chan struct{}
}

// newGatedProc builds the view for the recorded members and starts one
// server per member. Stop it with close.
func newGatedProc(t testing.TB, members []fingerprint.Stat, onRead func(pid int)) *gatedProc {
	t.Helper()
	gp := &gatedProc{root: t.TempDir(), onRead: onRead}
	for _, m := range members {
		g := &gate{
			gp:   gp,
			rec:  m,
			link: filepath.Join(gp.root, strconv.Itoa(m.PID)),
			dir:  filepath.Join(gp.root, ".gate-"+strconv.Itoa(m.PID)),
			done: make(chan struct{}),
		}
		if err := os.Mkdir(g.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(g.fifo(), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(procPID(m.PID)+"/status", filepath.Join(g.dir, "status")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(g.dir, g.link); err != nil {
			t.Fatal(err)
		}
		gp.gates = append(gp.gates, g)
		go g.serve()
	}
	return gp
}

func procPID(pid int) string { return procRoot + "/" + strconv.Itoa(pid) }

func (g *gate) fifo() string { return filepath.Join(g.dir, "stat") }

// replace atomically points root/<pid> at target.
func (g *gate) replace(target string) error {
	tmp := g.link + ".new"
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, g.link)
}

// freshFIFO puts a new FIFO in place for the next read, so the reader
// being served (which holds the old one) sees EOF after its answer.
func (g *gate) freshFIFO() error {
	tmp := g.fifo() + ".new"
	os.Remove(tmp)
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, g.fifo())
}

func (g *gate) serve() {
	defer close(g.done)
	for {
		fd, err := unix.Open(g.fifo(), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		if g.stop.Load() {
			unix.Close(fd)
			return
		}
		g.gp.reads.Add(1)
		g.gp.mu.Lock()
		if g.gp.onRead != nil {
			g.gp.onRead(g.rec.PID)
		}
		g.gp.mu.Unlock()
		data, rerr := os.ReadFile(procPID(g.rec.PID) + "/stat")
		dead := !fingerprint.Alive(procRoot, g.rec)
		if dead {
			err = g.replace(procPID(g.rec.PID))
		} else {
			err = g.freshFIFO()
		}
		if rerr == nil {
			unix.Write(fd, data)
		}
		// Without data the reader gets an empty file: a parse error, which
		// pgkill treats exactly as a vanished process.
		unix.Close(fd)
		if dead || err != nil {
			return
		}
	}
}

// close stops every server still waiting for a read.
func (gp *gatedProc) close() {
	for _, g := range gp.gates {
		g.stop.Store(true)
		select {
		case <-g.done:
			continue
		default:
		}
		// Unblock the server's open(O_WRONLY) by being its reader.
		fd, err := unix.Open(g.fifo(), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		<-g.done
		if err == nil {
			unix.Close(fd)
		}
	}
}
