package taskiter

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kc-watchman/kc-watchman/internal/atomicfile"
	"github.com/kc-watchman/kc-watchman/internal/fingerprint"
	"github.com/kc-watchman/kc-watchman/internal/trust"
)

// A layout read from the kernel's BTF holds until the next boot, and the
// read is a tenth of a short-lived caller's run (kc-hook's: 1.5-2 ms of
// mapping and walking five megabytes). LoadCached keeps it in a file of
// the caller's private state dir, with the boot's ID. A layout from
// the file is trusted no more than one read afresh: the verifier checks
// the program built from it, every pass checks this process's record
// against /proc, and a layout that fails either is removed and read
// again from the BTF.

// cacheVersion heads the file; a kc-watchman whose layout has other
// fields writes another.
const cacheVersion = "kc-watchman taskiter layout 3"

// cacheMax caps what is read of the file.
const cacheMax = 2048

func (l *layout) fields() []struct {
	name string
	v    *uint32
} {
	return []struct {
		name string
		v    *uint32
	}{
		{"task.pid", &l.taskPID}, {"task.tgid", &l.taskTGID}, {"task.exit_state", &l.taskExitState},
		{"task.start_boottime", &l.taskStart}, {"task.comm", &l.taskComm}, {"task.signal", &l.taskSignal},
		{"signal.pids", &l.signalPIDs}, {"signal.nr_threads", &l.signalThreads}, {"pid.numbers", &l.pidNumbers},
		{"upid.nr", &l.upidNR}, {"task.real_parent", &l.taskParent}, {"task.real_cred", &l.taskCred},
		{"cred.uid", &l.credUID}, {"PIDTYPE_PGID", &l.pidtypePGID}, {"btf.bpf_iter_task", &l.iterFunc},
		{"btf.bpf_rdonly_cast", &l.rdonlyCast}, {"btf.task_struct", &l.taskStruct},
		{"btf.bpf_iter_task_new", &l.walkNew}, {"btf.bpf_iter_task_next", &l.walkNext},
		{"btf.bpf_iter_task_destroy", &l.walkDestroy},
	}
}

func encodeCache(boot string, l layout) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\nboot %s\n", cacheVersion, boot)
	for _, f := range l.fields() {
		fmt.Fprintf(&b, "%s %d\n", f.name, *f.v)
	}
	fmt.Fprintf(&b, "sum %016x\n", cacheSum(b.Bytes()))
	return b.Bytes()
}

// cacheSum guards the file against a changed digit: PIDTYPE_PGID 3
// instead of 2 reads the session for the group, which a process that
// leads both (as a systemd service does) cannot tell from its own record.
func cacheSum(data []byte) uint64 {
	h := fnv.New64a()
	h.Write(data)
	return h.Sum64()
}

// decodeCache reads a file encodeCache wrote for boot: every field once,
// nothing else.
func decodeCache(data []byte, boot string) (layout, error) {
	var l layout
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	fields := l.fields()
	if len(lines) != 3+len(fields) || lines[0] != cacheVersion {
		return layout{}, errors.New("not a layout this kc-watchman writes")
	}
	body := data[:len(data)-len(lines[len(lines)-1])-1]
	if lines[len(lines)-1] != fmt.Sprintf("sum %016x", cacheSum(body)) {
		return layout{}, errors.New("its checksum does not match")
	}
	if lines[1] != "boot "+boot {
		return layout{}, errors.New("written during another boot")
	}
	for i, f := range fields {
		name, v, ok := strings.Cut(lines[2+i], " ")
		if !ok || name != f.name {
			return layout{}, fmt.Errorf("line %d: %q, want %s", 3+i, lines[2+i], f.name)
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return layout{}, fmt.Errorf("line %d: %w", 3+i, err)
		}
		*f.v = uint32(n)
	}
	if l.iterFunc == 0 {
		return layout{}, errors.New("no iterator function")
	}
	if err := l.validate(); err != nil {
		return layout{}, err
	}
	return l, nil
}

// readCache returns the layout in path if it was written in this boot by
// this user, and nobody else could have written it.
func readCache(path, boot string) (layout, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return layout{}, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return layout{}, err
	}
	if err := trust.Stat(path, &st, unix.S_IFREG, false, uint32(os.Geteuid())); err != nil {
		return layout{}, err
	}
	data, err := io.ReadAll(io.LimitReader(f, cacheMax+1))
	if err != nil {
		return layout{}, err
	}
	if len(data) > cacheMax {
		return layout{}, fmt.Errorf("%s is larger than %d bytes", path, cacheMax)
	}
	return decodeCache(data, boot)
}

// LoadCached is Load with the layout kept in the file at path, in a
// directory only the caller may write to (a state dir). A layout there
// from this boot is used instead of the kernel's BTF; one read from the
// BTF is written there. The file is only an aid: when it cannot be read
// or written, LoadCached does what Load does.
func LoadCached(path string) (*Program, error) {
	if err := checkNamespaces(); err != nil {
		return nil, err
	}
	boot, err := fingerprint.BootID()
	if err != nil {
		return Load()
	}
	if l, err := readCache(path, boot); err == nil {
		// A cached layout whose walk the kernel refuses is not taken
		// with the task iterator program instead: the BTF decides.
		p, err := loadLayout(l)
		if err == nil && (l.walkNew == 0 || p.w != nil) {
			p.cache = path
			return p, nil
		}
		p.Close()
		os.Remove(path)
	}
	l, err := readLayout()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	p, err := loadLayout(l)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	// Best effort: a cache that cannot be written costs the next caller
	// the BTF read, nothing else.
	_ = atomicfile.Write(dir, ".tmp-layout-*", path, encodeCache(boot, l), 0o600, "iterator layout")
	return p, nil
}
