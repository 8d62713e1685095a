// Package taskiter lists the host's processes through a BPF task iterator:
// a small program the kernel runs once per task, which writes each
// process's ID, process group, exit state, thread count, start time and
// comm into one stream read with a few read(2) calls. Listing /proc costs
// a getdents(2) share, a getpgid(2) and, for a group leader, an
// openat/read/close per process; on a host with tens of thousands of
// processes, and on virtual machines where each system call is dear, that
// is most of a scan's time.
//
// The program is built here, at run time, from the kernel's own BTF (so no
// compiler and no object file are involved) and lives only while Each
// runs. It needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), a kernel with
// BTF and task iterators (5.8 or later), and a caller in the host's PID
// and time namespaces, whose numbers it reports; where any of that is
// missing, Each fails with an error wrapping ErrUnavailable and callers
// list /proc instead.
//
// The listing is not a census to stake a signal on. The kernel's iterator
// has been seen to leave out a live process (PID 1, on this project's
// Linux 6.18 VMs, while /proc shows it), and Each's closing self-check
// cannot notice an absence. Callers confirm from /proc whatever a missing
// process would change: package trees reads the stat of every group
// leader it did not see before calling a group leaderless.
package taskiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
)

// ErrUnavailable wraps every reason the iterator cannot be used here.
var ErrUnavailable = errors.New("BPF task iterator unavailable")

// Task is one process (thread-group leader) as the kernel saw it.
type Task struct {
	PID  int
	PGID int // 0 for kernel threads
	// ExitState is task->exit_state: non-zero once the thread-group
	// leader has exited.
	ExitState uint32
	// Threads is the process's live thread count (num_threads in stat).
	Threads    int
	StartTicks uint64
	comm       [16]byte
}

// Comm returns the task's comm, without the NUL padding; the slice is
// only valid during the call to the Each callback.
func (t *Task) Comm() []byte {
	c := t.comm[:]
	if i := bytes.IndexByte(c, 0); i >= 0 {
		c = c[:i]
	}
	return c
}

// Zombie reports what fingerprint.Stat.Zombie reports for the same
// process: its leader has exited and no other thread keeps it alive.
func (t *Task) Zombie() bool { return t.ExitState != 0 && t.Threads <= 1 }

// Inode numbers of the initial PID and time namespaces
// (include/linux/proc_ns.h): fixed, on every boot.
const (
	initPIDNSIno  = 0xEFFFFFFC
	initTimeNSIno = 0xEFFFFFFA
)

// nsPerTick converts start_boottime to the clock ticks of /proc/<pid>/stat
// (USER_HZ = 100, as fingerprint and trees assume).
const nsPerTick = 1_000_000_000 / 100

// Each runs one pass of the iterator and calls fn for every process of the
// host, in ascending PID order. If Each returns an error, what fn was
// given must be thrown away: the pass ends with a check that the kernel's
// numbers for this very process agree with /proc, and a wrong layout shows
// only there.
func Each(fn func(*Task)) error {
	if err := checkNamespaces(); err != nil {
		return err
	}
	l, err := readLayout()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	prog, err := program(l)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	progFd, err := loadProgram(prog, l.iterFunc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer unix.Close(progFd)
	fd, err := openIter(progFd)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer unix.Close(fd)

	self, selfPGID := os.Getpid(), unix.Getpgrp()
	var me *Task
	var t Task
	err = readRecords(fd, func(rec []byte) {
		t = Task{
			PID:        int(binary.NativeEndian.Uint32(rec[0:])),
			PGID:       int(binary.NativeEndian.Uint32(rec[4:])),
			ExitState:  binary.NativeEndian.Uint32(rec[8:]),
			Threads:    int(binary.NativeEndian.Uint32(rec[12:])),
			StartTicks: binary.NativeEndian.Uint64(rec[16:]) / nsPerTick,
		}
		copy(t.comm[:], rec[24:40])
		if t.PID == self {
			c := t
			me = &c
		}
		fn(&t)
	})
	if err != nil {
		return err
	}
	return checkSelf(me, self, selfPGID)
}

// readRecords reads the iterator to its end and hands on whole records;
// a read(2) may end inside one.
func readRecords(fd int, fn func([]byte)) error {
	// The kernel fills at most one seq_file buffer (8 pages) per read.
	buf := make([]byte, 32<<10)
	have := 0
	for {
		n, err := unix.Read(fd, buf[have:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read task iterator: %w", err)
		}
		if n == 0 {
			if have != 0 {
				return fmt.Errorf("read task iterator: %d bytes left over (record size mismatch)", have)
			}
			return nil
		}
		have += n
		whole := have - have%recordSize
		for off := 0; off < whole; off += recordSize {
			fn(buf[off : off+recordSize])
		}
		have = copy(buf, buf[whole:have])
	}
}

// checkNamespaces refuses callers outside the initial PID and time
// namespaces: the program reports the initial namespaces' PIDs and an
// unshifted boot clock.
func checkNamespaces() error {
	for _, ns := range []struct {
		name string
		ino  uint64
	}{{"pid", initPIDNSIno}, {"time", initTimeNSIno}} {
		var st unix.Stat_t
		err := unix.Stat("/proc/self/ns/"+ns.name, &st)
		if errors.Is(err, unix.ENOENT) && ns.name == "time" {
			continue // a kernel without time namespaces
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if st.Ino != ns.ino {
			return fmt.Errorf("%w: not in the host's %s namespace", ErrUnavailable, ns.name)
		}
	}
	return nil
}

// checkSelf compares the iterator's record of this process with what
// getpgrp(2) and /proc/self/stat say.
func checkSelf(me *Task, self, pgid int) error {
	if me == nil {
		return fmt.Errorf("%w: this process (%d) is missing from the listing", ErrUnavailable, self)
	}
	st, err := fingerprint.ReadStat(fingerprint.DefaultRoot, self)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if me.PGID != pgid || me.StartTicks != st.StartTicks || string(me.Comm()) != st.Comm || me.Zombie() {
		return fmt.Errorf("%w: the listing disagrees with /proc for this process: pgid %d, start %d, comm %q (want %d, %d, %q)",
			ErrUnavailable, me.PGID, me.StartTicks, me.Comm(), pgid, st.StartTicks, st.Comm)
	}
	return nil
}
