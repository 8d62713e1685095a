package taskiter

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestBuilderResolve(t *testing.T) {
	marker := func(n int32) insn { return movImm(r0, n) }
	tests := []struct {
		name  string
		build func(b *builder)
		// want maps the index of each jump to the imm of the marker
		// instruction it must land on; "" error means it resolves.
		want  map[int]int32
		error string
	}{
		{"no jumps", func(b *builder) {
			b.add(marker(1))
			b.label("unused")
			b.add(exit())
		}, map[int]int32{}, ""},
		{"jump over nothing", func(b *builder) {
			b.jump(jeqImm(r1, 0, 0), "next")
			b.label("next")
			b.add(marker(7))
		}, map[int]int32{0: 7}, ""},
		{"two jumps to one label, one to another", func(b *builder) {
			b.add(marker(1))
			b.jump(jeqImm(r1, 0, 0), "b")  // 1
			b.jump(jneReg(r2, r3, 0), "a") // 2
			b.add(marker(2))
			b.label("a")
			b.add(marker(3))              // 4
			b.jump(jeqImm(r1, 5, 0), "b") // 5
			b.add(marker(4))
			b.add(marker(5))
			b.label("b")
			b.add(marker(6)) // 8
		}, map[int]int32{1: 6, 2: 3, 5: 6}, ""},
		{"missing label", func(b *builder) {
			b.jump(jeqImm(r1, 0, 0), "nowhere")
			b.label("somewhere")
			b.add(exit())
		}, nil, `"nowhere"`},
		{"label behind the jump", func(b *builder) {
			b.label("back")
			b.add(marker(1))
			b.jump(jeqImm(r1, 0, 0), "back")
			b.add(exit())
		}, nil, `"back"`},
		{"a loop: back to a label behind, and out", func(b *builder) {
			b.add(marker(1))
			b.label("top")
			b.add(marker(2))                 // 1
			b.jump(jeqImm(r1, 0, 0), "out")  // 2
			b.back(jneReg(r2, r3, 0), "top") // 3
			b.back(ja(0), "top")             // 4
			b.label("out")
			b.add(marker(3)) // 5
		}, map[int]int32{2: 3, 3: 2, 4: 2}, ""},
		{"back to a label ahead", func(b *builder) {
			b.back(ja(0), "ahead")
			b.label("ahead")
			b.add(exit())
		}, nil, `"ahead"`},
		{"back to a missing label", func(b *builder) {
			b.add(marker(1))
			b.back(ja(0), "nowhere")
		}, nil, `"nowhere"`},
		{"label on the jump itself", func(b *builder) {
			b.add(marker(1))
			b.label("self")
			b.jump(jeqImm(r1, 0, 0), "self")
			b.add(exit())
		}, nil, `"self"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b builder
			tt.build(&b)
			prog, err := b.resolve()
			if tt.error != "" {
				if err == nil || !strings.Contains(err.Error(), tt.error) {
					t.Fatalf("resolve error = %v, want one naming %s", err, tt.error)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			jumps := 0
			for at, in := range prog {
				if in.op != opJeqImm && in.op != opJneReg && in.op != opJa {
					continue
				}
				jumps++
				want, ok := tt.want[at]
				if !ok {
					t.Fatalf("unexpected jump at %d", at)
				}
				// eBPF jumps are relative to the next instruction.
				to := at + 1 + int(in.off)
				if to < 0 || to >= len(prog) || prog[to].op != opMovImm || prog[to].imm != want {
					t.Errorf("jump at %d (off %d) lands on %d, want the marker %d", at, in.off, to, want)
				}
			}
			if jumps != len(tt.want) {
				t.Errorf("%d jumps in the program, want %d", jumps, len(tt.want))
			}
		})
	}
}

// progLayout is a plausible layout with every offset distinct, so that
// each load can be traced to its field.
var progLayout = layout{
	taskPID: 1264, taskTGID: 1268, taskExitState: 1160, taskStart: 1560, taskComm: 1752, taskSignal: 1848,
	signalPIDs: 360, signalThreads: 8, pidNumbers: 144, upidNR: 4, pidtypePGID: 2, iterFunc: 64274,
	taskParent: 1424, taskCred: 1816, credUID: 8,
}

func TestProgram(t *testing.T) {
	cast := progLayout
	cast.rdonlyCast, cast.taskStruct = 65425, 114
	for _, l := range []layout{progLayout, cast} {
		t.Run(fmt.Sprintf("cast %d", l.rdonlyCast), func(t *testing.T) { testProgram(t, l) })
	}
}

func testProgram(t *testing.T, l layout) {
	prog, err := program(l)
	if err != nil {
		t.Fatalf("program: %v", err)
	}
	// With the cast kfunc, every load through the task reads the
	// untrusted pointer it returns: the cast comes first.
	firstTaskLoad := slices.IndexFunc(prog, func(in insn) bool { return (in.op == opLdxW || in.op == opLdxDW) && in.src == r7 })
	castAt := slices.IndexFunc(prog, func(in insn) bool { return in.op == opCall && in.src == pseudoKfuncCall })
	switch {
	case l.rdonlyCast == 0 && castAt >= 0:
		t.Errorf("kfunc call at %d without a cast kfunc in the layout", castAt)
	case l.rdonlyCast != 0 && (castAt < 2 || castAt+1 >= len(prog) || castAt > firstTaskLoad):
		t.Fatalf("kfunc call at %d, first load through r7 at %d: want the cast before it", castAt, firstTaskLoad)
	case l.rdonlyCast != 0:
		want := []insn{mov(r1, r7), movImm(r2, int32(l.taskStruct)), callKfunc(l.rdonlyCast), mov(r7, r0)}
		if got := prog[castAt-2 : castAt+2]; !slices.Equal(got, want) {
			t.Errorf("cast sequence %+v, want %+v", got, want)
		}
	}
	if n := len(prog); n < 2 || prog[n-1] != exit() || prog[n-2] != movImm(r0, 0) {
		t.Fatalf("program does not end with r0 = 0; exit: %+v", prog[max(0, n-2):])
	}
	for at, in := range prog {
		if in.op != opJeqImm && in.op != opJneReg {
			continue
		}
		// Only forward jumps, inside the program: the verifier refuses
		// anything else, and a wrong target would skip the write.
		if to := at + 1 + int(in.off); in.off < 0 || to >= len(prog) {
			t.Errorf("jump at %d with off %d lands outside the program", at, in.off)
		}
	}
	// Each field is read by one load of its size, from the right base
	// register: the task (r7), its signal (r8) or the pgid's struct pid (r2).
	loads := []struct {
		what     string
		op       uint8
		src      uint8
		off      uint32
		wantOnce bool
	}{
		{"task->pid", opLdxW, r7, l.taskPID, true},
		{"task->tgid", opLdxW, r7, l.taskTGID, true},
		{"task->exit_state", opLdxW, r7, l.taskExitState, true},
		{"task->start_boottime", opLdxDW, r7, l.taskStart, true},
		{"task->comm[0:8]", opLdxDW, r7, l.taskComm, true},
		{"task->comm[8:16]", opLdxDW, r7, l.taskComm + 8, true},
		{"task->signal", opLdxDW, r7, l.taskSignal, true},
		{"signal->nr_threads", opLdxW, r8, l.signalThreads, true},
		{"signal->pids[PIDTYPE_PGID]", opLdxDW, r8, l.signalPIDs + 8*l.pidtypePGID, true},
		{"pid->numbers[0].nr", opLdxW, r2, l.pidNumbers + l.upidNR, true},
		{"task->real_parent", opLdxDW, r7, l.taskParent, true},
		{"real_parent->tgid", opLdxW, r2, l.taskTGID, true},
		{"task->real_cred", opLdxDW, r7, l.taskCred, true},
		{"real_cred->uid", opLdxW, r2, l.credUID, true},
	}
	for _, ld := range loads {
		n := 0
		for _, in := range prog {
			if in.op == ld.op && in.src == ld.src && in.off == int16(ld.off) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d loads of op %#x from r%d+%d, want 1", ld.what, n, ld.op, ld.src, ld.off)
		}
	}
	// The record written covers exactly recordSize bytes below r10.
	var written [recordSize]int
	for _, in := range prog {
		size := map[uint8]int{opStxW: 4, opStW: 4, opStxDW: 8}[in.op]
		if size == 0 || in.dst != r10 {
			continue
		}
		for i := range size {
			at := int(in.off) + recordSize + i
			if at < 0 || at >= recordSize {
				t.Fatalf("store %+v outside the record", in)
			}
			written[at]++
		}
	}
	for i, n := range written {
		if n == 0 {
			t.Errorf("record byte %d is never written: the verifier refuses uninitialised stack", i)
		}
	}
}

func TestProgramRefusesLargeOffsets(t *testing.T) {
	const limit = 1<<15 - 1
	tests := []struct {
		name string
		set  func(l *layout)
		ok   bool
	}{
		{"task->pid at the limit", func(l *layout) { l.taskPID = limit }, true},
		{"task->pid", func(l *layout) { l.taskPID = limit + 1 }, false},
		{"task->tgid", func(l *layout) { l.taskTGID = limit + 1 }, false},
		{"task->exit_state", func(l *layout) { l.taskExitState = 40000 }, false},
		{"task->start_boottime", func(l *layout) { l.taskStart = limit + 1 }, false},
		{"task->signal", func(l *layout) { l.taskSignal = 1 << 20 }, false},
		// comm is read in two loads, the second 8 bytes further.
		{"task->comm, second half at the limit", func(l *layout) { l.taskComm = limit - 8 }, true},
		{"task->comm, second half beyond", func(l *layout) { l.taskComm = limit - 7 }, false},
		{"signal->nr_threads", func(l *layout) { l.signalThreads = limit + 1 }, false},
		{"signal->pids[PGID] at the limit", func(l *layout) { l.signalPIDs = limit - 16 }, true},
		{"signal->pids[PGID] beyond", func(l *layout) { l.signalPIDs = limit - 15 }, false},
		{"pid->numbers + upid.nr at the limit", func(l *layout) { l.pidNumbers, l.upidNR = limit-4, 4 }, true},
		{"pid->numbers + upid.nr beyond", func(l *layout) { l.pidNumbers, l.upidNR = limit-3, 4 }, false},
		{"task->real_parent", func(l *layout) { l.taskParent = limit + 1 }, false},
		{"task->real_cred", func(l *layout) { l.taskCred = limit + 1 }, false},
		{"cred->uid", func(l *layout) { l.credUID = limit + 1 }, false},
		{"cred->uid at 65536, which an int16 reads as 0", func(l *layout) { l.credUID = 1 << 16 }, false},
		{"a kfunc's ID", func(l *layout) { l.walkNext = 1 << 31 }, false},
	}
	// The task iterator program, the walk and a layout file all refuse
	// the same offsets.
	builds := []struct {
		name  string
		build func(l layout) ([]insn, error)
	}{
		{"task iterator", program},
		{"walk", func(l layout) ([]insn, error) { return walkProgram(l, 42) }},
		{"layout file", func(l layout) ([]insn, error) {
			if _, err := decodeCache(encodeCache(testBoot, l), testBoot); err != nil {
				return nil, err
			}
			return program(l)
		}},
	}
	for _, b := range builds {
		for _, tt := range tests {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				l := progLayout
				l.rdonlyCast, l.taskStruct = 65425, 114
				l.walkNew, l.walkNext, l.walkDestroy = 64198, 64201, 64193
				tt.set(&l)
				testLargeOffset(t, b.build, l, tt.ok)
			})
		}
	}
}

func testLargeOffset(t *testing.T, build func(layout) ([]insn, error), l layout, ok bool) {
	t.Helper()
	prog, err := build(l)
	if !ok {
		if err == nil || !strings.Contains(err.Error(), "does not fit") {
			t.Fatalf("error = %v, want a refusal", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	// An offset that passes must reach the instruction whole, not
	// wrapped negative.
	for _, in := range prog {
		if in.off < 0 && in.dst != r10 && in.op != opJeqImm && in.op != opJneReg && in.op != opJa {
			t.Errorf("instruction %+v has a negative offset", in)
		}
	}
}

func TestEncode(t *testing.T) {
	little := binary.NativeEndian.Uint16([]byte{1, 0}) == 1
	regs := func(dst, src uint8) byte {
		if little {
			return dst | src<<4
		}
		return dst<<4 | src
	}
	// native lays out a number given most significant byte first.
	native := func(b ...byte) []byte {
		if little {
			for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
				b[i], b[j] = b[j], b[i]
			}
		}
		return b
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name string
		prog []insn
		want []byte
	}{
		{"empty", nil, []byte{}},
		{"exit", []insn{exit()}, []byte{0x95, 0, 0, 0, 0, 0, 0, 0}},
		{"load: dst and src apart, offset", []insn{ldxW(r2, r7, 0x1234)},
			cat([]byte{0x61, regs(2, 7)}, native(0x12, 0x34), native(0, 0, 0, 0))},
		{"store: negative offset", []insn{stxDW(r10, -40, r3)},
			cat([]byte{0x7b, regs(10, 3)}, native(0xff, 0xd8), native(0, 0, 0, 0))},
		{"negative immediate", []insn{addImm(r2, -40)},
			cat([]byte{0x07, regs(2, 0)}, native(0, 0), native(0xff, 0xff, 0xff, 0xd8))},
		{"call", []insn{call(helperSeq)}, cat([]byte{0x85, 0}, native(0, 0), native(0, 0, 0, 127))},
		{"kfunc call: src BPF_PSEUDO_KFUNC_CALL, BTF ID", []insn{callKfunc(0x1ff91)}, cat([]byte{0x85, regs(0, 2)}, native(0, 0), native(0, 1, 0xff, 0x91))},
		{"two instructions in order", []insn{mov(r6, r1), jneReg(r2, r3, 5)},
			cat([]byte{0xbf, regs(6, 1)}, native(0, 0), native(0, 0, 0, 0), []byte{0x5d, regs(2, 3)}, native(0, 5), native(0, 0, 0, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := encode(tt.prog)
			if len(got) != 8*len(tt.prog) {
				t.Fatalf("encode: %d bytes for %d instructions", len(got), len(tt.prog))
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("encode = % x, want % x", got, tt.want)
			}
		})
	}
	if little {
		// The kernel's struct bpf_insn has dst_reg:4 then src_reg:4,
		// which on little-endian puts dst in the low nibble.
		if got := encode([]insn{mov(r1, r10)})[1]; got != 0xa1 {
			t.Errorf("registers byte %#x, want 0xa1 (dst r1 low, src r10 high)", got)
		}
	}
}
