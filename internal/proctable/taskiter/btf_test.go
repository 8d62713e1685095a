package taskiter

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// btfBuilder writes a native-endian BTF blob by hand, independently of the
// parser, so that the parser's idea of each kind's trailer is checked
// against the format (include/uapi/linux/btf.h) rather than against itself.
type btfBuilder struct {
	types []byte
	strs  []byte
	offs  map[string]uint32
	next  uint32 // the ID the next type gets; IDs count from 1
}

func newBTF() *btfBuilder {
	return &btfBuilder{strs: []byte{0}, offs: map[string]uint32{"": 0}, next: 1}
}

// str returns the offset of s in the string section, adding it once, as
// the kernel's deduplicated BTF does.
func (b *btfBuilder) str(s string) uint32 {
	if off, ok := b.offs[s]; ok {
		return off
	}
	off := b.rawStr(s)
	b.offs[s] = off
	return off
}

// rawStr appends s to the string section even if it is already there.
func (b *btfBuilder) rawStr(s string) uint32 {
	off := uint32(len(b.strs))
	b.strs = append(append(b.strs, s...), 0)
	return off
}

// add appends a type: its 12-byte header (name_off, info, size/type) and
// the trailer given as 32-bit words. It returns the type's ID.
func (b *btfBuilder) add(nameOff uint32, kind int, kflag bool, vlen int, sizeType uint32, trailer ...uint32) uint32 {
	info := uint32(vlen)&0xffff | uint32(kind)<<24
	if kflag {
		info |= 1 << 31
	}
	for _, w := range append([]uint32{nameOff, info, sizeType}, trailer...) {
		b.types = binary.NativeEndian.AppendUint32(b.types, w)
	}
	id := b.next
	b.next++
	return id
}

// btfMember is one struct member; bits is the raw offset word, which with
// kind_flag set holds the bitfield size in its top 8 bits.
type btfMember struct {
	name string
	bits uint32
}

func (b *btfBuilder) addStruct(name string, kflag bool, members ...btfMember) uint32 {
	var words []uint32
	for _, m := range members {
		words = append(words, b.str(m.name), 1, m.bits)
	}
	return b.add(b.str(name), kindStruct, kflag, len(members), 4096, words...)
}

// blob lays out header, type section, string section.
func (b *btfBuilder) blob() []byte {
	hdr := btfHeader{
		Magic: btfMagic, Version: 1, HdrLen: 24,
		TypeOff: 0, TypeLen: uint32(len(b.types)),
		StrOff: uint32(len(b.types)), StrLen: uint32(len(b.strs)),
	}
	out, err := binary.Append(nil, binary.NativeEndian, hdr)
	if err != nil {
		panic(err)
	}
	if len(out) != 24 {
		panic("BTF header is not 24 bytes")
	}
	return append(append(out, b.types...), b.strs...)
}

// wantLayout is what goodStructs describe; every value differs from the
// others so that a field read from the wrong member shows.
var wantLayout = layout{
	taskPID: 1504, taskTGID: 1508, taskExitState: 1244, taskStart: 1640, taskComm: 2032, taskSignal: 2720,
	signalPIDs: 336, signalThreads: 20, pidNumbers: 96, upidNR: 4, pidtypePGID: 3,
	taskParent: 1416, taskCred: 2408, credUID: 12,
}

type btfStruct struct {
	name    string
	kflag   bool
	members []btfMember
}

// goodStructs describes the five structs the way a kernel might, with
// members the parser must pass over: a bitfield and a name that ends in
// a wanted one.
func goodStructs() []btfStruct {
	l := wantLayout
	return []btfStruct{
		{"task_struct", true, []btfMember{
			{"thread_info", 0},
			{"flags", 3<<24 | 77}, // a bitfield, not wanted: no refusal
			{"exit_state", 8 * l.taskExitState},
			{"pid", 8 * l.taskPID},
			{"tgid", 8 * l.taskTGID},
			{"start_boottime", 8 * l.taskStart},
			{"comm", 8 * l.taskComm},
			{"real_parent", 8 * l.taskParent},
			{"real_cred", 8 * l.taskCred},
			{"signal", 8 * l.taskSignal},
		}},
		{"signal_struct", false, []btfMember{
			{"sigcnt", 0},
			{"nr_threads", 8 * l.signalThreads},
			{"pids", 8 * l.signalPIDs},
		}},
		{"pid", false, []btfMember{
			{"count", 0},
			{"level", 32},
			{"numbers", 8 * l.pidNumbers},
		}},
		{"upid", false, []btfMember{
			{"nr", 8 * l.upidNR},
			{"ns", 64},
		}},
		{"cred", false, []btfMember{
			{"usage", 0},
			{"uid", 8 * l.credUID},
		}},
	}
}

func (b *btfBuilder) addStructs(ss []btfStruct) {
	for _, s := range ss {
		b.addStruct(s.name, s.kflag, s.members...)
	}
}

// addIterFunc adds the FUNC the iterator attaches to (vlen is its
// linkage) and returns its ID; then the enum pid_type the program indexes
// signal->pids with.
func (b *btfBuilder) addIterFunc() uint32 {
	proto := b.add(0, kindFuncProto, false, 0, 0)
	id := b.add(b.str(iterFuncName), kindFunc, false, 1, proto)
	b.addPidType(wantLayout.pidtypePGID)
	return id
}

// addPidType adds enum pid_type with PIDTYPE_PGID = pgid.
func (b *btfBuilder) addPidType(pgid uint32) uint32 {
	return b.add(b.str(pidTypeEnum), kindEnum, false, 3, 4,
		b.str("PIDTYPE_PID"), 0, b.str("PIDTYPE_TGID"), 1, b.str(pidTypePGID), pgid)
}

// filler is a type of a given kind with the trailer the format gives it,
// for checking that the parser steps over it to the right next type.
type filler struct {
	name    string
	kind    int
	vlen    int
	trailer int // 32-bit words after the 12-byte header
}

var fillers = []filler{
	{"INT", kindInt, 0, 1},
	{"PTR", 2, 0, 0},
	{"ARRAY", kindArray, 0, 3},
	{"STRUCT", kindStruct, 3, 9},
	{"UNION", kindUnion, 2, 6},
	{"ENUM", kindEnum, 3, 6},
	{"FWD", 7, 0, 0},
	{"TYPEDEF", 8, 0, 0},
	{"VOLATILE", 9, 0, 0},
	{"CONST", 10, 0, 0},
	{"RESTRICT", 11, 0, 0},
	{"FUNC", kindFunc, 1, 0}, // vlen is the linkage, not a count
	{"FUNC_PROTO", kindFuncProto, 3, 6},
	{"VAR", kindVar, 0, 1},
	{"DATASEC", kindDatasec, 2, 6},
	{"FLOAT", 16, 0, 0},
	{"DECL_TAG", kindDeclTag, 0, 1},
	{"TYPE_TAG", 18, 0, 0},
	{"ENUM64", kindEnum64, 2, 6},
}

// addFiller adds f with a zero trailer: a parser that steps over too
// little reads zeros as the next type, kind 0, and refuses; one that
// steps over too much swallows the next type.
func (b *btfBuilder) addFiller(f filler) uint32 {
	return b.add(b.str("filler_"+strings.ToLower(f.name)), f.kind, false, f.vlen, 0, make([]uint32, f.trailer)...)
}

func TestParseLayoutGood(t *testing.T) {
	type built struct {
		blob   []byte
		funcID uint32
	}
	var cases []struct {
		name  string
		build func() built
	}
	add := func(name string, build func() built) {
		cases = append(cases, struct {
			name  string
			build func() built
		}{name, build})
	}
	// One type of each kind ahead of the wanted ones, alone, so that a
	// wrong trailer size is pinned on its kind.
	for _, f := range fillers {
		add("after "+f.name, func() built {
			b := newBTF()
			b.addFiller(f)
			b.addFiller(f)
			b.addStructs(goodStructs())
			id := b.addIterFunc()
			return built{b.blob(), id}
		})
	}
	add("every kind, wanted types spread between them", func() built {
		b := newBTF()
		ss := goodStructs()
		var id uint32
		for i, f := range fillers {
			b.addFiller(f)
			if i < len(ss) {
				b.addStructs(ss[i : i+1])
			}
			if i == len(fillers)/2 {
				id = b.addIterFunc()
			}
		}
		return built{b.blob(), id}
	})
	add("func first, structs last", func() built {
		b := newBTF()
		id := b.addIterFunc()
		for _, f := range fillers {
			b.addFiller(f)
		}
		b.addStructs(goodStructs())
		return built{b.blob(), id}
	})
	add("wanted struct defined twice, same layout", func() built {
		b := newBTF()
		b.addStructs(goodStructs())
		b.addStructs(goodStructs()[1:2])
		id := b.addIterFunc()
		return built{b.blob(), id}
	})
	add("union with a wanted name is not the struct", func() built {
		b := newBTF()
		b.add(b.str("upid"), kindUnion, false, 1, 8, b.str("nr"), 1, 8*99)
		b.addStructs(goodStructs())
		id := b.addIterFunc()
		return built{b.blob(), id}
	})
	add("another function of another name", func() built {
		b := newBTF()
		b.add(b.str("bpf_iter_tasks"), kindFunc, false, 1, 0)
		b.add(b.str("bpf_iter_task_file"), kindFunc, false, 1, 0)
		b.addStructs(goodStructs())
		id := b.addIterFunc()
		return built{b.blob(), id}
	})
	add("wanted name only as a suffix, then on its own", func() built {
		b := newBTF()
		ss := goodStructs()
		// "xpid" comes first in the string section; "pid" after it.
		b.str("xpid")
		ss[0].members = append([]btfMember{{"xpid", 8 * 7}}, ss[0].members...)
		b.addStructs(ss)
		id := b.addIterFunc()
		return built{b.blob(), id}
	})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.build()
			got, err := parseLayout(in.blob)
			if err != nil {
				t.Fatalf("parseLayout: %v", err)
			}
			want := wantLayout
			want.iterFunc = in.funcID
			if got != want {
				t.Errorf("parseLayout =\n%+v, want\n%+v", got, want)
			}
		})
	}
}

// TestParseLayoutCast: the cast kfunc's ID and struct task_struct's are
// taken only together, the kfunc by its exact name, the struct's first
// definition when there are two alike.
func TestParseLayoutCast(t *testing.T) {
	addStructs := func(b *btfBuilder, ss []btfStruct) (task uint32) {
		for _, st := range ss {
			if id := b.addStruct(st.name, st.kflag, st.members...); st.name == "task_struct" && task == 0 {
				task = id
			}
		}
		return task
	}
	addCast := func(b *btfBuilder, name string) uint32 {
		proto := b.add(0, kindFuncProto, false, 0, 0)
		return b.add(b.str(name), kindFunc, false, 1, proto)
	}
	tests := []struct {
		name  string
		build func(b *btfBuilder) (cast, task uint32)
	}{
		{"kfunc after the structs", func(b *btfBuilder) (uint32, uint32) {
			task := addStructs(b, goodStructs())
			return addCast(b, castFuncName), task
		}},
		{"kfunc before the structs", func(b *btfBuilder) (uint32, uint32) {
			cast := addCast(b, castFuncName)
			return cast, addStructs(b, goodStructs())
		}},
		{"task_struct twice alike: the first", func(b *btfBuilder) (uint32, uint32) {
			task := addStructs(b, goodStructs())
			addStructs(b, goodStructs()[:1])
			return addCast(b, castFuncName), task
		}},
		{"no kfunc", func(b *btfBuilder) (uint32, uint32) {
			addStructs(b, goodStructs())
			return 0, 0
		}},
		{"only names that start like it", func(b *btfBuilder) (uint32, uint32) {
			addCast(b, "bpf_rdonly_cast_x")
			addCast(b, "bpf_rdonly")
			addStructs(b, goodStructs())
			return 0, 0
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBTF()
			cast, task := tt.build(b)
			b.addIterFunc()
			l, err := parseLayout(b.blob())
			if err != nil {
				t.Fatalf("parseLayout: %v", err)
			}
			if l.rdonlyCast != cast || l.taskStruct != task {
				t.Errorf("rdonlyCast %d, taskStruct %d; want %d, %d", l.rdonlyCast, l.taskStruct, cast, task)
			}
		})
	}
}

func TestParseLayoutRefuses(t *testing.T) {
	withStructs := func(edit func([]btfStruct) []btfStruct) func() []byte {
		return func() []byte {
			b := newBTF()
			b.addStructs(edit(goodStructs()))
			b.addIterFunc()
			return b.blob()
		}
	}
	setMember := func(ss []btfStruct, st, m string, bits uint32, kflag bool) []btfStruct {
		for i := range ss {
			if ss[i].name != st {
				continue
			}
			ss[i].kflag = kflag
			for j := range ss[i].members {
				if ss[i].members[j].name == m {
					ss[i].members[j].bits = bits
				}
			}
		}
		return ss
	}
	withTypes := func(edit func(b *btfBuilder)) func() []byte {
		return func() []byte {
			b := newBTF()
			b.addStructs(goodStructs())
			b.addIterFunc()
			edit(b)
			return b.blob()
		}
	}
	good := withTypes(func(*btfBuilder) {})
	patchHeader := func(at int, v uint32) func() []byte {
		return func() []byte {
			blob := good()
			binary.NativeEndian.PutUint32(blob[at:], v)
			return blob
		}
	}

	tests := []struct {
		name  string
		blob  func() []byte
		error string // a part of the error that says which refusal it was
	}{
		{"empty", func() []byte { return nil }, "header"},
		{"shorter than the header", func() []byte { return good()[:20] }, "header"},
		{"bad magic", func() []byte {
			blob := good()
			binary.NativeEndian.PutUint16(blob, 0x9feb) // the other endianness
			return blob
		}, "bad magic"},
		{"type section beyond the blob", patchHeader(12, 1<<20), "beyond the blob"},
		{"string section beyond the blob", patchHeader(20, 1<<20), "beyond the blob"},
		{"string section offset beyond the blob", patchHeader(16, 1<<31), "beyond the blob"},
		{"header length beyond the blob", patchHeader(4, 1<<31), "beyond the blob"},
		{"blob cut short", func() []byte { b := good(); return b[:len(b)-1] }, "beyond the blob"},
		{"truncated type header", withTypes(func(b *btfBuilder) {
			b.types = append(b.types, 1, 2, 3, 4, 5, 6, 7, 8)
		}), "truncated"},
		{"truncated struct members", withTypes(func(b *btfBuilder) {
			b.addStruct("task_struct", false, btfMember{"pid", 0}, btfMember{"tgid", 32})
			b.types = b.types[:len(b.types)-4]
		}), "truncated"},
		{"truncated INT trailer", withTypes(func(b *btfBuilder) {
			b.add(0, kindInt, false, 0, 4)
		}), "truncated"},
		{"wanted member is a bitfield", withStructs(func(ss []btfStruct) []btfStruct {
			return setMember(ss, "task_struct", "exit_state", 1<<24|8*wantLayout.taskExitState, true)
		}), "bitfield"},
		{"wanted member is a wide bitfield", withStructs(func(ss []btfStruct) []btfStruct {
			return setMember(ss, "signal_struct", "nr_threads", 0xff<<24|8*wantLayout.signalThreads, true)
		}), "bitfield"},
		{"wanted member not byte-aligned", withStructs(func(ss []btfStruct) []btfStruct {
			return setMember(ss, "upid", "nr", 8*wantLayout.upidNR+3, false)
		}), "not byte-aligned"},
		{"wanted member not byte-aligned, kind_flag set", withStructs(func(ss []btfStruct) []btfStruct {
			return setMember(ss, "pid", "numbers", 8*wantLayout.pidNumbers+4, true)
		}), "not byte-aligned"},
		{"wanted struct twice, different layouts", withTypes(func(b *btfBuilder) {
			ss := setMember(goodStructs()[2:3], "pid", "numbers", 8*(wantLayout.pidNumbers+8), false)
			b.addStructs(ss)
		}), "twice"},
		{"wanted struct twice, second lacks a member", withTypes(func(b *btfBuilder) {
			b.addStruct("upid", false, btfMember{"ns", 64})
		}), "twice"},
		{"missing struct", withStructs(func(ss []btfStruct) []btfStruct {
			return append(ss[:3:3], ss[4:]...) // no upid
		}), "no struct upid"},
		{"wanted struct only declared", func() []byte {
			b := newBTF()
			ss := goodStructs()
			b.add(b.str("signal_struct"), kindFwdForTest, false, 0, 0)
			b.addStructs(append(ss[:1:1], ss[2:]...))
			b.addIterFunc()
			return b.blob()
		}, "no struct signal_struct"},
		{"missing member", withStructs(func(ss []btfStruct) []btfStruct {
			ss[0].members = ss[0].members[:len(ss[0].members)-1] // no signal
			return ss
		}), "no member signal"},
		{"member name only as a suffix", withStructs(func(ss []btfStruct) []btfStruct {
			// "pid" is in the string section only inside "xpid"; the
			// struct pid is named otherwise for that.
			for i := range ss[0].members {
				if ss[0].members[i].name == "pid" {
					ss[0].members[i].name = "xpid"
				}
			}
			ss[2].name = "xpid"
			return ss
		}), "no member pid"},
		{"no iterator function", func() []byte {
			b := newBTF()
			b.addStructs(goodStructs())
			b.add(b.str(iterFuncName), kindTypedefForTest, false, 0, 0)
			b.add(b.str("bpf_iter_task_vma"), kindFunc, false, 1, 0)
			return b.blob()
		}, "no function " + iterFuncName},
		{"no enum pid_type", func() []byte {
			b := newBTF()
			b.addStructs(goodStructs())
			proto := b.add(0, kindFuncProto, false, 0, 0)
			b.add(b.str(iterFuncName), kindFunc, false, 1, proto)
			// The value under another enum's name is not it.
			b.add(b.str("pid_types"), kindEnum, false, 1, 4, b.str(pidTypePGID), 2)
			return b.blob()
		}, "no PIDTYPE_PGID"},
		{"enum pid_type twice, different values", withTypes(func(b *btfBuilder) { b.addPidType(wantLayout.pidtypePGID + 1) }), "enum pid_type twice"},
		{"PIDTYPE_PGID no index", func() []byte {
			b := newBTF()
			b.addStructs(goodStructs())
			proto := b.add(0, kindFuncProto, false, 0, 0)
			b.add(b.str(iterFuncName), kindFunc, false, 1, proto)
			b.addPidType(1 << 20)
			return b.blob()
		}, "not an index"},
		{"kind 0", withTypes(func(b *btfBuilder) { b.add(0, 0, false, 0, 0) }), "kind 0"},
		{"kind 20", withTypes(func(b *btfBuilder) { b.add(0, 20, false, 0, 0) }), "unknown kind 20"},
		{"kind 31", withTypes(func(b *btfBuilder) { b.add(0, 31, true, 0, 0) }), "unknown kind 31"},
		{"unknown kind ahead of the wanted types", func() []byte {
			b := newBTF()
			b.add(0, 25, false, 0, 0)
			b.addStructs(goodStructs())
			b.addIterFunc()
			return b.blob()
		}, "unknown kind 25"},
	}
	// The header test cases patch fields by offset: make sure the good
	// blob parses, or every refusal could be the same one.
	if _, err := parseLayout(good()); err != nil {
		t.Fatalf("test setup: the unedited blob is refused: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := parseLayout(tt.blob())
			if err == nil {
				t.Fatalf("parseLayout = %+v, nil; want an error containing %q", l, tt.error)
			}
			if !strings.Contains(err.Error(), tt.error) {
				t.Errorf("parseLayout error %q; want it to contain %q", err, tt.error)
			}
		})
	}
}

// Kinds the parser has no name for: a TYPEDEF with the iterator
// function's name, or a FWD with a wanted struct's, is not what is wanted.
const (
	kindFwdForTest     = 7
	kindTypedefForTest = 8
)

func TestNameAt(t *testing.T) {
	// Offsets: 0 "" | 1 "xpid" | 6 "pid" | 10 "tgid" (unterminated)
	strs := []byte("\x00xpid\x00pid\x00tgid")
	for _, tt := range []struct {
		off  uint32
		want string
		ok   bool
	}{
		{0, "", true},
		{1, "xpid", true},
		{6, "pid", true},
		// BTF may share a suffix: a name that starts inside another is
		// that name's tail.
		{2, "pid", true},
		{10, "", false}, // runs off the end
		{14, "", false}, // past the end
		{1 << 31, "", false},
	} {
		got := nameAt(strs, tt.off)
		if (got != nil) != tt.ok || string(got) != tt.want {
			t.Errorf("nameAt(%d) = %q (nil %v), want %q (ok %v)", tt.off, got, got == nil, tt.want, tt.ok)
		}
	}
}

// TestParseKernelBTF reads this kernel's own BTF: the layout must be found
// and plausible, whatever the live tests then make of it.
func TestParseKernelBTF(t *testing.T) {
	if _, err := os.Stat(kernelBTF); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("kernel without BTF: %v", err)
	}
	l, err := readLayout()
	if err != nil {
		t.Fatalf("readLayout: %v", err)
	}
	if l.iterFunc == 0 {
		t.Error("iterFunc = 0")
	}
	if l.taskTGID != l.taskPID+4 {
		// pid_t pid; pid_t tgid; have been adjacent since 2.6.
		t.Errorf("task_struct: pid at %d, tgid at %d; want adjacent", l.taskPID, l.taskTGID)
	}
	if l.upidNR != 0 {
		t.Errorf("upid.nr at %d, want 0", l.upidNR)
	}
	if l.pidtypePGID != 2 {
		// PID, TGID, PGID, SID since 4.19.
		t.Errorf("PIDTYPE_PGID = %d, want 2", l.pidtypePGID)
	}
	t.Logf("%+v", l)
}

// TestParseLayoutWalk: the open-coded iterator's kfuncs are taken only
// all three together, and with the cast, which the walk reads through.
func TestParseLayoutWalk(t *testing.T) {
	addFunc := func(b *btfBuilder, name string) uint32 {
		proto := b.add(0, kindFuncProto, false, 0, 0)
		return b.add(b.str(name), kindFunc, false, 1, proto)
	}
	all := []string{walkNewName, walkNextName, walkDestroyName}
	tests := []struct {
		name  string
		funcs []string
		cast  bool
		want  bool
	}{
		{"all three and the cast", all, true, true},
		{"all three, no cast", all, false, false},
		{"no destroy", all[:2], true, false},
		{"no new", all[1:], true, false},
		{"names that only start like them", []string{walkNewName + "_x", "bpf_iter_task_nex", walkDestroyName + "2"}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBTF()
			ids := map[string]uint32{}
			for _, f := range tt.funcs {
				ids[f] = addFunc(b, f)
			}
			for _, st := range goodStructs() {
				b.addStruct(st.name, st.kflag, st.members...)
			}
			if tt.cast {
				addFunc(b, castFuncName)
			}
			b.addIterFunc()
			l, err := parseLayout(b.blob())
			if err != nil {
				t.Fatalf("parseLayout: %v", err)
			}
			got := [3]uint32{l.walkNew, l.walkNext, l.walkDestroy}
			want := [3]uint32{}
			if tt.want {
				want = [3]uint32{ids[walkNewName], ids[walkNextName], ids[walkDestroyName]}
			}
			if got != want {
				t.Errorf("walk kfuncs %v, want %v", got, want)
			}
		})
	}
}
