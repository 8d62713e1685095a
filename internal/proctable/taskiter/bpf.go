package taskiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bpf(2) commands, program and attach types (include/uapi/linux/bpf.h).
const (
	cmdProgLoad     = 5
	cmdLinkCreate   = 28
	cmdIterCreate   = 33
	progTracing     = 26
	attachTraceIter = 28
)

// progLoadAttr is the head of union bpf_attr for BPF_PROG_LOAD, up to
// attach_btf_obj_fd; the kernel takes a shorter attr as zero-extended.
type progLoadAttr struct {
	progType           uint32
	insnCnt            uint32
	insns              uint64
	license            uint64
	logLevel           uint32
	logSize            uint32
	logBuf             uint64
	kernVersion        uint32
	progFlags          uint32
	progName           [16]byte
	progIfindex        uint32
	expectedAttachType uint32
	progBTFFd          uint32
	funcInfoRecSize    uint32
	funcInfo           uint64
	funcInfoCnt        uint32
	lineInfoRecSize    uint32
	lineInfo           uint64
	lineInfoCnt        uint32
	attachBTFID        uint32
	attachBTFObjFd     uint32
	_                  uint32
}

// linkCreateAttr is union bpf_attr for BPF_LINK_CREATE of an iterator:
// without iterInfo, over every task of the host (the task iterator
// program); with it, over the tasks it names (the walk's one).
type linkCreateAttr struct {
	progFd      uint32
	targetFd    uint32
	attachType  uint32
	flags       uint32
	iterInfo    uint64
	iterInfoLen uint32
	_           uint32
}

type iterCreateAttr struct {
	linkFd uint32
	flags  uint32
}

func bpf(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// license: bpf_seq_write is only offered to GPL-compatible programs. The
// program is generated here at run time and lives only while it runs.
var license = []byte("GPL\x00")

// loadProgram loads the iterator program. The verifier gives up with
// EAGAIN when a signal is pending (the Go runtime's preemption signals
// are), so the load is repeated then, as libbpf does. When the verifier
// refuses the program, the load is repeated with its log for the error;
// a program accepted only then is not used.
func loadProgram(prog []insn, attachID uint32) (int, error) {
	code := encode(prog)
	defer runtime.KeepAlive(code)
	attr := progLoadAttr{
		progType:           progTracing,
		insnCnt:            uint32(len(prog)),
		insns:              uint64(uintptr(unsafe.Pointer(&code[0]))),
		license:            uint64(uintptr(unsafe.Pointer(&license[0]))),
		expectedAttachType: attachTraceIter,
		attachBTFID:        attachID,
	}
	copy(attr.progName[:], "kc_tasks")
	load := func() (int, error) {
		for try := 0; ; try++ {
			fd, err := bpf(cmdProgLoad, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
			if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && try < 5 {
				continue
			}
			return fd, err
		}
	}
	fd, err := load()
	if err == nil {
		return fd, nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EFAULT) {
		return -1, fmt.Errorf("load task iterator program: %w", err)
	}
	log := make([]byte, 64<<10)
	attr.logLevel, attr.logSize = 1, uint32(len(log))
	attr.logBuf = uint64(uintptr(unsafe.Pointer(&log[0])))
	if fd, err := load(); err == nil {
		unix.Close(fd)
	}
	runtime.KeepAlive(log)
	if i := bytes.IndexByte(log, 0); i >= 0 {
		log = log[:i]
	}
	return -1, fmt.Errorf("load task iterator program: %w; verifier: %s", err, lastLines(string(log), 4))
}

// openIter attaches the program as a task iterator and opens one pass of
// it; reading the returned descriptor runs the program over every task,
// or, with tid, over that one task alone (the walk's single run).
func openIter(progFd, tid int) (int, error) {
	la := linkCreateAttr{progFd: uint32(progFd), attachType: attachTraceIter}
	// union bpf_iter_link_info: task.tid, pid, pid_fd. On the heap, which
	// does not move, since the kernel finds it through an integer.
	info := new([12]byte)
	if tid > 0 {
		binary.NativeEndian.PutUint32(info[0:], uint32(tid))
		la.iterInfo, la.iterInfoLen = uint64(uintptr(unsafe.Pointer(info))), uint32(len(info))
	}
	linkFd, err := bpf(cmdLinkCreate, unsafe.Pointer(&la), unsafe.Sizeof(la))
	runtime.KeepAlive(info)
	if err != nil {
		return -1, fmt.Errorf("attach task iterator: %w", err)
	}
	defer unix.Close(linkFd)
	ia := iterCreateAttr{linkFd: uint32(linkFd)}
	fd, err := bpf(cmdIterCreate, unsafe.Pointer(&ia), unsafe.Sizeof(ia))
	if err != nil {
		return -1, fmt.Errorf("open task iterator: %w", err)
	}
	return fd, nil
}

func lastLines(s string, n int) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte(" | ")))
}
