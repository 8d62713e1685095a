package taskiter

import "encoding/binary"

// The few eBPF instructions the program is made of
// (Documentation/bpf/standardization/instruction-set.rst).
type insn struct {
	op       uint8
	dst, src uint8
	off      int16
	imm      int32
}

const (
	r0, r1, r2, r3, r6, r7, r8, r9, r10 = 0, 1, 2, 3, 6, 7, 8, 9, 10
)

// Opcodes: class | size/source | mode/operation.
const (
	opLdxW    = 0x61 // dst = *(u32 *)(src + off)
	opLdxDW   = 0x79 // dst = *(u64 *)(src + off)
	opStxW    = 0x63 // *(u32 *)(dst + off) = src
	opStxDW   = 0x7b // *(u64 *)(dst + off) = src
	opStW     = 0x62 // *(u32 *)(dst + off) = imm
	opMovReg  = 0xbf // dst = src (64-bit)
	opMovImm  = 0xb7 // dst = imm (64-bit)
	opAddImm  = 0x07 // dst += imm (64-bit)
	opJeqImm  = 0x15 // if dst == imm goto +off
	opJneReg  = 0x5d // if dst != src goto +off
	opJa      = 0x05 // goto +off
	opLdImm64 = 0x18 // dst = imm64 (two instructions)
	opCall    = 0x85 // call helper imm
	opExit    = 0x95
	helperSeq = 127 // bpf_seq_write(seq, data, len)

	pseudoKfuncCall = 2
)

func ldxW(dst, src uint8, off uint32) insn {
	return insn{op: opLdxW, dst: dst, src: src, off: int16(off)}
}
func ldxDW(dst, src uint8, off uint32) insn {
	return insn{op: opLdxDW, dst: dst, src: src, off: int16(off)}
}
func stxW(dst uint8, off int16, src uint8) insn {
	return insn{op: opStxW, dst: dst, src: src, off: off}
}
func stxDW(dst uint8, off int16, src uint8) insn {
	return insn{op: opStxDW, dst: dst, src: src, off: off}
}
func mov(dst, src uint8) insn          { return insn{op: opMovReg, dst: dst, src: src} }
func movImm(dst uint8, imm int32) insn { return insn{op: opMovImm, dst: dst, imm: imm} }
func addImm(dst uint8, imm int32) insn { return insn{op: opAddImm, dst: dst, imm: imm} }
func jeqImm(dst uint8, imm int32, skip int16) insn {
	return insn{op: opJeqImm, dst: dst, imm: imm, off: skip}
}
func jneReg(dst, src uint8, skip int16) insn {
	return insn{op: opJneReg, dst: dst, src: src, off: skip}
}
func ja(skip int16) insn     { return insn{op: opJa, off: skip} }
func call(helper int32) insn { return insn{op: opCall, imm: helper} }

// callKfunc calls the kernel function with BTF ID id in vmlinux
// (src BPF_PSEUDO_KFUNC_CALL, off 0: not a module's BTF).
func callKfunc(id uint32) insn { return insn{op: opCall, src: pseudoKfuncCall, imm: int32(id)} }
func exit() insn               { return insn{op: opExit} }

// encode lays the instructions out as the kernel reads them: 8 bytes each,
// the registers in one byte (dst in the low nibble on little-endian hosts).
func encode(prog []insn) []byte {
	out := make([]byte, 0, 8*len(prog))
	little := binary.NativeEndian.Uint16([]byte{1, 0}) == 1
	for _, in := range prog {
		regs := in.dst&0xf | in.src<<4
		if !little {
			regs = in.dst<<4 | in.src&0xf
		}
		out = append(out, in.op, regs)
		out = binary.NativeEndian.AppendUint16(out, uint16(in.off))
		out = binary.NativeEndian.AppendUint32(out, uint32(in.imm))
	}
	return out
}
