package taskiter

import "fmt"

// record is what the program writes for each process, and what Each
// parses: native-endian, 48 bytes.
//
//	0  pid        u32  thread-group ID (init PID namespace)
//	4  pgid       u32  process group ID (init PID namespace), 0 for none
//	8  exit_state u32  non-zero: zombie or dead
//	12 nr_threads u32  live threads of the process (signal->nr_threads)
//	16 start      u64  start_boottime in nanoseconds
//	24 comm       [16]byte
//	40 ppid       u32  the real parent's thread-group ID (init PID namespace), 0 for none
//	44 uid        u32  real UID (init user namespace)
const recordSize = 48

// The context of a task iterator program, struct bpf_iter__task, is fixed
// by the iterator ABI: the meta pointer first, then the task pointer; and
// the seq_file is the first member of struct bpf_iter_meta.
const (
	ctxMeta = 0
	ctxTask = 8
	metaSeq = 0
	// metaSeqNum is bpf_iter_meta.seq_num: the number of the task the
	// program is called for, from 0.
	metaSeqNum = 16
)

// program builds the iterator program for a kernel's layout. The kernel
// calls it once per task (threads included) and once more with a NULL
// task at the end; it writes one record per thread-group leader.
//
// Every load through the task pointer is checked by the verifier against
// the kernel's BTF (a pointer must be a pointer, a load must stay inside
// its member) and made fault-safe: a NULL signal or pid pointer reads as
// zero, which is what the record says for none (pgid and nr_threads 0).
// Hence no NULL test after the task's: each doubles the paths the
// verifier walks. real_parent and real_cred are never NULL: both are set
// at fork and kept until the task is freed, and the iterator holds its
// task.
//
// Where the kernel has bpf_rdonly_cast, the task is read through an
// untrusted cast of itself. A pointer member loaded through a trusted
// pointer costs the verifier four linear searches of the kernel's BTF by
// name (is the member trusted, RCU-protected, either or NULL?): about a
// millisecond each on 6.x, 3 ms of a 3.5 ms load for the three the
// program reads. Loads through an untrusted pointer skip them and are
// just as fault-safe; nothing the program reads needs the trust, since it
// passes no pointer to a helper. The cast is inlined as a move, so the
// pass costs the same. (bpf_probe_read_kernel for the pointer members
// also skips the searches, but its seven calls per process cost more at
// 10,000 processes than the searches do.)
func program(l layout) ([]insn, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	var b builder
	const rec = -recordSize
	b.add(mov(r6, r1))              // r6 = ctx
	b.add(ldxDW(r7, r6, ctxTask))   // r7 = ctx->task
	b.jump(jeqImm(r7, 0, 0), "out") // the end of the pass
	if l.rdonlyCast != 0 {
		b.add(mov(r1, r7))
		b.add(movImm(r2, int32(l.taskStruct)))
		b.add(callKfunc(l.rdonlyCast)) // r0 = untrusted (struct task_struct *)task
		b.add(mov(r7, r0))
	}
	b.add(ldxW(r2, r7, l.taskPID))                     // r2 = task->pid
	b.add(ldxW(r3, r7, l.taskTGID))                    // r3 = task->tgid
	b.jump(jneReg(r2, r3, 0), "out")                   // a thread, not a process
	b.add(stxW(r10, rec+0, r3))                        // rec.pid = tgid
	b.add(ldxW(r2, r7, l.taskExitState))               //
	b.add(stxW(r10, rec+8, r2))                        // rec.exit_state
	b.add(ldxDW(r2, r7, l.taskStart))                  //
	b.add(stxDW(r10, rec+16, r2))                      // rec.start
	b.add(ldxDW(r2, r7, l.taskComm))                   //
	b.add(stxDW(r10, rec+24, r2))                      // rec.comm[0:8]
	b.add(ldxDW(r2, r7, l.taskComm+8))                 //
	b.add(stxDW(r10, rec+32, r2))                      // rec.comm[8:16]
	b.add(ldxDW(r2, r7, l.taskParent))                 // r2 = task->real_parent
	b.add(ldxW(r3, r2, l.taskTGID))                    //
	b.add(stxW(r10, rec+40, r3))                       // rec.ppid = real_parent->tgid
	b.add(ldxDW(r2, r7, l.taskCred))                   // r2 = task->real_cred
	b.add(ldxW(r3, r2, l.credUID))                     // kuid_t is one u32
	b.add(stxW(r10, rec+44, r3))                       // rec.uid = real_cred->uid
	b.add(ldxDW(r8, r7, l.taskSignal))                 // r8 = task->signal
	b.add(ldxW(r2, r8, l.signalThreads))               //
	b.add(stxW(r10, rec+12, r2))                       // rec.nr_threads
	b.add(ldxDW(r2, r8, l.signalPIDs+8*l.pidtypePGID)) // r2 = signal->pids[PIDTYPE_PGID]
	b.add(ldxW(r2, r2, l.pidNumbers+l.upidNR))         // numbers[0].nr: the init namespace's number
	b.add(stxW(r10, rec+4, r2))                        // rec.pgid
	b.label("write")
	b.add(ldxDW(r1, r6, ctxMeta)) // r1 = ctx->meta
	b.add(ldxDW(r1, r1, metaSeq)) // r1 = meta->seq
	b.add(mov(r2, r10))
	b.add(addImm(r2, rec)) // r2 = &rec
	b.add(movImm(r3, recordSize))
	b.add(call(helperSeq))
	b.label("out")
	b.add(movImm(r0, 0))
	b.add(exit())
	return b.resolve()
}

// validate refuses a layout whose offsets or IDs do not fit the
// instructions that carry them: cast to their fields, they would wrap to
// other offsets, which the verifier takes for any inside the struct.
func (l layout) validate() error {
	// PIDTYPE_PGID indexes signal_struct.pids, which has 4 entries in
	// every kernel so far; parseLayout allows up to 15, and so must a
	// layout from a file, or 8*index could wrap into another field.
	if l.pidtypePGID > 15 {
		return fmt.Errorf("PIDTYPE_PGID %d is not an index into signal_struct.pids", l.pidtypePGID)
	}
	// Sums in 64 bits: in 32, a huge component wraps to a small offset.
	for _, off := range []uint64{uint64(l.taskPID), uint64(l.taskTGID), uint64(l.taskExitState), uint64(l.taskStart),
		uint64(l.taskComm) + 8, uint64(l.taskSignal), uint64(l.signalThreads),
		uint64(l.signalPIDs) + 8*uint64(l.pidtypePGID), uint64(l.pidNumbers) + uint64(l.upidNR),
		uint64(l.taskParent), uint64(l.taskCred), uint64(l.credUID)} {
		if off > 1<<15-1 {
			return fmt.Errorf("field offset %d does not fit an instruction", off)
		}
	}
	for _, id := range []uint32{l.taskStruct, l.rdonlyCast, l.walkNew, l.walkNext, l.walkDestroy} {
		if id > 1<<31-1 {
			return fmt.Errorf("BTF ID %d does not fit an instruction", id)
		}
	}
	return nil
}

// builder resolves forward jumps to labels.
type builder struct {
	prog   []insn
	jumps  map[int]string
	backs  map[int]string
	labels map[string]int
}

func (b *builder) add(in insn) { b.prog = append(b.prog, in) }

func (b *builder) jump(in insn, label string) {
	if b.jumps == nil {
		b.jumps = map[int]string{}
	}
	b.jumps[len(b.prog)] = label
	b.add(in)
}

// back adds a jump to a label already placed: a loop's.
func (b *builder) back(in insn, label string) {
	if b.backs == nil {
		b.backs = map[int]string{}
	}
	b.backs[len(b.prog)] = label
	b.add(in)
}

func (b *builder) label(name string) {
	if b.labels == nil {
		b.labels = map[string]int{}
	}
	b.labels[name] = len(b.prog)
}

func (b *builder) resolve() ([]insn, error) {
	for at, name := range b.jumps {
		to, ok := b.labels[name]
		if !ok || to <= at {
			return nil, fmt.Errorf("jump to %q: no such label ahead", name)
		}
		b.prog[at].off = int16(to - at - 1)
	}
	for at, name := range b.backs {
		to, ok := b.labels[name]
		if !ok || to > at {
			return nil, fmt.Errorf("jump back to %q: no such label behind", name)
		}
		b.prog[at].off = int16(to - at - 1)
	}
	return b.prog, nil
}
