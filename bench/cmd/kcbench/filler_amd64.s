#include "textflag.h"

// func clonePauser(all, old *uint64, parent int) (pid int, errno int)
//
// clone(CLONE_VM|SIGCHLD) a child process that shares our memory and runs
// nothing but raw system calls, entirely in registers: it never reads or
// writes memory (so sharing the stack pointer is harmless), sets
// PR_SET_PDEATHSIG to SIGKILL, exits if its parent is already gone, and
// then pauses forever. Every signal is blocked around the clone, so the
// child inherits a full mask: only SIGKILL (and SIGSTOP) reach it, and no
// Go signal handler can ever run on it.
TEXT ·clonePauser(SB),NOSPLIT,$0-40
	MOVQ parent+16(FP), R13

	// rt_sigprocmask(SIG_SETMASK, all, old, 8)
	MOVQ $14, AX
	MOVQ $2, DI
	MOVQ all+0(FP), SI
	MOVQ old+8(FP), DX
	MOVQ $8, R10
	SYSCALL

	// clone(CLONE_VM|SIGCHLD, stack 0 (same SP), 0, 0, 0)
	MOVQ $56, AX
	MOVQ $0x111, DI
	MOVQ $0, SI
	MOVQ $0, DX
	MOVQ $0, R10
	MOVQ $0, R8
	SYSCALL
	CMPQ AX, $0
	JEQ child

	// Parent: restore the signal mask.
	MOVQ AX, R12
	MOVQ $14, AX
	MOVQ $2, DI
	MOVQ old+8(FP), SI
	MOVQ $0, DX
	MOVQ $8, R10
	SYSCALL
	CMPQ R12, $0xfffffffffffff001
	JLS ok
	MOVQ $-1, pid+24(FP)
	NEGQ R12
	MOVQ R12, errno+32(FP)
	RET
ok:
	MOVQ R12, pid+24(FP)
	MOVQ $0, errno+32(FP)
	RET

child:
	// prctl(PR_SET_PDEATHSIG, SIGKILL)
	MOVQ $157, AX
	MOVQ $1, DI
	MOVQ $9, SI
	MOVQ $0, DX
	MOVQ $0, R10
	MOVQ $0, R8
	SYSCALL
	// The parent may have died before the prctl: then leave.
	MOVQ $110, AX
	SYSCALL
	CMPQ AX, R13
	JNE gone
pause:
	MOVQ $34, AX
	SYSCALL
	JMP pause
gone:
	MOVQ $60, AX
	MOVQ $0, DI
	SYSCALL
	JMP gone
