package taskiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// kernelBTF is where the kernel describes its own types (CONFIG_DEBUG_INFO_BTF).
const kernelBTF = "/sys/kernel/btf/vmlinux"

// layout holds where the fields the program reads sit in this kernel's
// structs, and the BTF ID of the iterator's attach point. It is read from
// the kernel's BTF by name, never assumed: struct layouts differ between
// builds and configurations.
type layout struct {
	taskPID, taskTGID, taskExitState, taskStart, taskComm, taskSignal uint32
	signalPIDs, signalThreads, pidNumbers, upidNR                     uint32
	// taskParent and taskCred point to the real parent (whose tgid is
	// the process's PPID) and the objective credentials /proc's status
	// reads the UIDs from; credUID is the real UID's kuid_t in them.
	taskParent, taskCred, credUID uint32
	// pidtypePGID is PIDTYPE_PGID in enum pid_type: the index of the
	// process group in signal_struct.pids.
	pidtypePGID uint32
	iterFunc    uint32
	// rdonlyCast is the BTF ID of the bpf_rdonly_cast kfunc (Linux 6.2)
	// and taskStruct that of struct task_struct, both 0 where the kernel
	// has no such kfunc: the program reads the task through an untrusted
	// cast of it, whose loads the verifier checks without its by-name
	// lookups of trusted and RCU members (about 3 ms of every load).
	rdonlyCast, taskStruct uint32
	// walkNew, walkNext and walkDestroy are the BTF IDs of the open-coded
	// task iterator's kfuncs (Linux 6.7), 0 where the kernel has none:
	// with them and the cast, one run of the program walks every process
	// (walk.go).
	walkNew, walkNext, walkDestroy uint32
}

// wantedMembers names, per struct, the members the program reads.
var wantedMembers = map[string][]string{
	"task_struct":   {"pid", "tgid", "exit_state", "start_boottime", "comm", "signal", "real_parent", "real_cred"},
	"cred":          {"uid"},
	"signal_struct": {"pids", "nr_threads"},
	"pid":           {"numbers"},
	"upid":          {"nr"},
}

// pidTypeEnum and pidTypePGID name the enum value the program indexes
// signal->pids with.
const (
	pidTypeEnum = "pid_type"
	pidTypePGID = "PIDTYPE_PGID"
)

// iterFuncName is the kernel function a task iterator program attaches to.
const iterFuncName = "bpf_iter_task"

// The open-coded task iterator's kfuncs.
const (
	walkNewName     = "bpf_iter_task_new"
	walkNextName    = "bpf_iter_task_next"
	walkDestroyName = "bpf_iter_task_destroy"
)

// castFuncName is the kfunc that makes a pointer an untrusted one of a
// given type; the verifier inlines it as a move.
const castFuncName = "bpf_rdonly_cast"

// BTF type kinds (include/uapi/linux/btf.h).
const (
	kindStruct    = 4
	kindUnion     = 5
	kindEnum      = 6
	kindFunc      = 12
	kindArray     = 3
	kindInt       = 1
	kindFuncProto = 13
	kindVar       = 14
	kindDatasec   = 15
	kindDeclTag   = 17
	kindEnum64    = 19
	kindMax       = 19
)

type btfHeader struct {
	Magic   uint16
	Version uint8
	Flags   uint8
	HdrLen  uint32
	TypeOff uint32
	TypeLen uint32
	StrOff  uint32
	StrLen  uint32
}

const btfMagic = 0xeb9f

// readLayout finds the layout in the kernel's BTF. Since Linux 6.16 the
// blob can be mapped (read-only, private), which costs next to nothing
// next to reading its megabytes through a buffer whose every page would
// fault in; older kernels get the read.
func readLayout() (layout, error) {
	f, err := os.Open(kernelBTF)
	if err != nil {
		return layout{}, fmt.Errorf("kernel BTF: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return layout{}, fmt.Errorf("kernel BTF: %w", err)
	}
	size := int(fi.Size())
	if size <= 0 {
		return layout{}, fmt.Errorf("kernel BTF: %s is empty", kernelBTF)
	}
	if blob, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_POPULATE); err == nil {
		defer unix.Munmap(blob)
		return parseLayout(blob)
	}
	blob := make([]byte, size)
	if _, err := io.ReadFull(f, blob); err != nil {
		return layout{}, fmt.Errorf("kernel BTF: %w", err)
	}
	return parseLayout(blob)
}

// parseLayout reads a BTF blob: the string section, for the offsets of
// the few names it needs, then the type section, for the structs and the
// function with those names.
func parseLayout(blob []byte) (layout, error) {
	var hdr btfHeader
	if _, err := binary.Decode(blob, binary.NativeEndian, &hdr); err != nil {
		return layout{}, fmt.Errorf("kernel BTF header: %w", err)
	}
	if hdr.Magic != btfMagic {
		return layout{}, fmt.Errorf("kernel BTF: bad magic %#x (not native-endian BTF)", hdr.Magic)
	}
	if hdr.Version != 1 || hdr.HdrLen < 24 {
		return layout{}, fmt.Errorf("kernel BTF: version %d, header of %d bytes: not the format this reader knows", hdr.Version, hdr.HdrLen)
	}
	section := func(off, n uint32) ([]byte, error) {
		start := uint64(hdr.HdrLen) + uint64(off)
		if start+uint64(n) > uint64(len(blob)) {
			return nil, fmt.Errorf("kernel BTF: section [%d, +%d) beyond the blob's %d bytes", start, n, len(blob))
		}
		return blob[start : start+uint64(n)], nil
	}
	strs, err := section(hdr.StrOff, hdr.StrLen)
	if err != nil {
		return layout{}, err
	}
	types, err := section(hdr.TypeOff, hdr.TypeLen)
	if err != nil {
		return layout{}, err
	}

	found, ids, err := findTypes(types, strs)
	if err != nil {
		return layout{}, err
	}
	if ids.iterFunc == 0 {
		return layout{}, fmt.Errorf("%w: kernel BTF has no function %s", errNoTaskIter, iterFuncName)
	}
	member := func(st, m string) (uint32, error) {
		ms, ok := found[st]
		if !ok {
			return 0, fmt.Errorf("kernel BTF has no struct %s", st)
		}
		off, ok := ms[m]
		if !ok {
			return 0, fmt.Errorf("kernel BTF: struct %s has no member %s at its top level", st, m)
		}
		return off, nil
	}
	l := layout{iterFunc: ids.iterFunc}
	if ids.rdonlyCast != 0 && ids.taskStruct != 0 {
		l.rdonlyCast, l.taskStruct = ids.rdonlyCast, ids.taskStruct
		if ids.walkNew != 0 && ids.walkNext != 0 && ids.walkDestroy != 0 {
			l.walkNew, l.walkNext, l.walkDestroy = ids.walkNew, ids.walkNext, ids.walkDestroy
		}
	}
	for _, f := range []struct {
		dst     *uint32
		st, mem string
	}{
		{&l.taskPID, "task_struct", "pid"},
		{&l.taskTGID, "task_struct", "tgid"},
		{&l.taskExitState, "task_struct", "exit_state"},
		{&l.taskStart, "task_struct", "start_boottime"},
		{&l.taskComm, "task_struct", "comm"},
		{&l.taskSignal, "task_struct", "signal"},
		{&l.signalPIDs, "signal_struct", "pids"},
		{&l.signalThreads, "signal_struct", "nr_threads"},
		{&l.pidNumbers, "pid", "numbers"},
		{&l.upidNR, "upid", "nr"},
		{&l.taskParent, "task_struct", "real_parent"},
		{&l.taskCred, "task_struct", "real_cred"},
		{&l.credUID, "cred", "uid"},
	} {
		if *f.dst, err = member(f.st, f.mem); err != nil {
			return layout{}, err
		}
	}
	v, ok := found[pidTypeEnum][pidTypePGID]
	if !ok {
		return layout{}, fmt.Errorf("kernel BTF has no %s in enum %s", pidTypePGID, pidTypeEnum)
	}
	if v > 15 {
		return layout{}, fmt.Errorf("kernel BTF: %s is %d, not an index into signal_struct.pids", pidTypePGID, v)
	}
	l.pidtypePGID = v
	return l, nil
}

// nameAt returns the NUL-terminated name at off in a string section, or
// nil when off is outside it or the name runs off its end.
func nameAt(strs []byte, off uint32) []byte {
	if uint64(off) >= uint64(len(strs)) {
		return nil
	}
	name := strs[off:]
	i := bytes.IndexByte(name, 0)
	if i < 0 {
		return nil
	}
	return name[:i]
}

// btfIDs are the type IDs the program names: the iterator's function,
// the cast kfunc and the task struct (the first, if defined twice).
type btfIDs struct {
	iterFunc, rdonlyCast, taskStruct uint32
	walkNew, walkNext, walkDestroy   uint32
}

// findTypes walks a type section and returns, for each struct whose name
// is wanted, the byte offsets of its wanted members, plus the IDs the
// program names. A wanted struct defined twice with different layouts is
// an error: the program could not know which one it reads.
//
// Names are looked up in the string section only for structs and
// functions whose name starts with a wanted name's first byte: the vmlinux
// blob has a hundred thousand types, and reading its megabytes of strings
// from end to end costs more than the task listing itself.
func findTypes(types, strs []byte) (map[string]map[string]uint32, btfIDs, error) {
	found := map[string]map[string]uint32{}
	var ids btfIDs
	var structFirst [256]bool
	for name := range wantedMembers {
		structFirst[name[0]] = true
	}
	for id, off := uint32(1), 0; off < len(types); id++ {
		if len(types)-off < 12 {
			return nil, btfIDs{}, fmt.Errorf("kernel BTF type %d: truncated", id)
		}
		nameOff := binary.NativeEndian.Uint32(types[off:])
		info := binary.NativeEndian.Uint32(types[off+4:])
		vlen, kind, kflag := int(info&0xffff), int(info>>24&0x1f), info>>31 == 1
		off += 12
		n, err := trailer(kind, vlen)
		if err != nil {
			return nil, btfIDs{}, fmt.Errorf("kernel BTF type %d: %w", id, err)
		}
		if len(types)-off < n {
			return nil, btfIDs{}, fmt.Errorf("kernel BTF type %d: truncated", id)
		}
		first := byte(0)
		if uint64(nameOff) < uint64(len(strs)) {
			first = strs[nameOff]
		}
		switch {
		case kind == kindEnum && first == pidTypeEnum[0] && string(nameAt(strs, nameOff)) == pidTypeEnum:
			for m := types[off : off+n]; len(m) >= 8; m = m[8:] {
				if string(nameAt(strs, binary.NativeEndian.Uint32(m))) == pidTypePGID {
					v := binary.NativeEndian.Uint32(m[4:])
					if prev, dup := found[pidTypeEnum][pidTypePGID]; dup && prev != v {
						return nil, btfIDs{}, fmt.Errorf("kernel BTF defines enum %s twice, with different values", pidTypeEnum)
					}
					found[pidTypeEnum] = map[string]uint32{pidTypePGID: v}
				}
			}
		case kind == kindFunc && (first == iterFuncName[0] || first == castFuncName[0]):
			switch string(nameAt(strs, nameOff)) {
			case iterFuncName:
				ids.iterFunc = id
			case castFuncName:
				ids.rdonlyCast = id
			case walkNewName:
				ids.walkNew = id
			case walkNextName:
				ids.walkNext = id
			case walkDestroyName:
				ids.walkDestroy = id
			}
		case kind == kindStruct && structFirst[first]:
			b := nameAt(strs, nameOff)
			want, ok := wantedMembers[string(b)]
			if !ok {
				break
			}
			name := string(b)
			ms, err := readMembers(types[off:off+n], kflag, strs, want)
			if err != nil {
				return nil, btfIDs{}, fmt.Errorf("kernel BTF struct %s: %w", name, err)
			}
			if prev, dup := found[name]; dup && !maps.Equal(prev, ms) {
				return nil, btfIDs{}, fmt.Errorf("kernel BTF defines struct %s twice, with different layouts", name)
			}
			found[name] = ms
			if name == "task_struct" && ids.taskStruct == 0 {
				ids.taskStruct = id
			}
		}
		off += n
	}
	return found, ids, nil
}

// readMembers reads a struct's member list and keeps the wanted ones that
// are whole bytes (no bitfields).
func readMembers(list []byte, kflag bool, strs []byte, want []string) (map[string]uint32, error) {
	ms := map[string]uint32{}
	for m := list; len(m) >= 12; m = m[12:] {
		b := nameAt(strs, binary.NativeEndian.Uint32(m[0:]))
		i := slices.IndexFunc(want, func(w string) bool { return w == string(b) })
		if i < 0 {
			continue
		}
		name := want[i]
		bits := binary.NativeEndian.Uint32(m[8:])
		if kflag {
			if bits>>24 != 0 {
				return nil, fmt.Errorf("member %s is a bitfield", name)
			}
			bits &= 0xffffff
		}
		if bits%8 != 0 {
			return nil, fmt.Errorf("member %s is not byte-aligned", name)
		}
		ms[name] = bits / 8
	}
	return ms, nil
}

// trailer is the size of the data that follows a type's 12-byte header.
func trailer(kind, vlen int) (int, error) {
	switch kind {
	case kindInt, kindVar, kindDeclTag:
		return 4, nil
	case kindArray:
		return 12, nil
	case kindStruct, kindUnion, kindDatasec, kindEnum64:
		return 12 * vlen, nil
	case kindEnum, kindFuncProto:
		return 8 * vlen, nil
	case 0:
		return 0, errors.New("kind 0 (void) in the type section")
	}
	if kind > kindMax {
		return 0, fmt.Errorf("unknown kind %d (newer BTF than this reader)", kind)
	}
	return 0, nil // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
}
