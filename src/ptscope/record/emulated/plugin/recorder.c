/* ptscope's emulated Intel PT recorder: a QEMU TCG plugin (user mode, x86-64 guests).

   QEMU translates the program's code into blocks (straight-line code ending at a branch)
   and, with this plugin loaded, calls on_block() every time a block starts running, with
   block chaining left on. From "thread T runs block B after block A" the recorder writes
   the Intel PT packets the hardware would have written for A's last instruction, straight
   into the recording (perf_file.c), plus the sideband perf needs (MMAP2 for every executable
   mapping, COMM, FORK, EXIT). docs/emulated-pt.md describes the design; the rules:

   - A block's instructions are counted when the next block arrives: only then is it known
     that the block ran to its end (a fault, an exclusive atomic step or the instruction
     budget can stop it before).
   - How control reached B is decided from A's last instruction, classified once at
     translation (x86_branch.c): fall-through, the direct target, either for a conditional
     jump, anything after an indirect branch or a ret.
   - A system call: the syscall callback writes TIP.PGD, and tracing starts again wherever
     the thread runs next (after the call, in a signal handler, where rt_sigreturn goes).
   - A signal: QEMU enters the handler's first block with the stack pointer at the signal
     frame it wrote, which holds the interrupted RIP. The plugin API of QEMU 7.2 has no
     register access, so the recorder reads the CPU state QEMU keeps in memory: generated
     code calls on_block() with the CPUArchState pointer in RBP (TCG_AREG0 on x86-64 hosts),
     and in CPUX86State the 16 general registers come first. The pointer is checked at the
     program's first block (RSP points at argc) and never trusted otherwise.
   - After every block a provisional end (FUP + TIP.PGD, pt_writer.h) follows the packets,
     so the file always holds a complete stream, however QEMU ends.

   Threads are host threads in QEMU user mode: each has its own state (thread-local), its
   own PT stream (an AUXTRACE queue) and its own clock (a cycle model: docs/emulated-pt.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "code_pages.h"
#include "elf_facts.h"
#include "perf_file.h"
#include "pt_writer.h"
#include "qemu_plugin_api.h"
#include "x86_branch.h"
#include "x86_length.h"

#ifndef PTSCOPE_PLUGIN_API
#define PTSCOPE_PLUGIN_API 1
#endif

QEMU_PLUGIN_EXPORT int qemu_plugin_version = PTSCOPE_PLUGIN_API;

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define NOINLINE __attribute__((noinline))

/* x86-64 system calls the recorder follows */
enum {
	SYS_read_ = 0, SYS_write_ = 1, SYS_open_ = 2, SYS_close_ = 3, SYS_mmap_ = 9,
	SYS_munmap_ = 11, SYS_rt_sigaction_ = 13, SYS_clone_ = 56, SYS_fork_ = 57,
	SYS_vfork_ = 58, SYS_exit_group_ = 231, SYS_prctl_ = 157, SYS_openat_ = 257,
};
#define CLONE_VM_ 0x100
#define PROT_EXEC_ 4
#define MAP_ANONYMOUS_ 0x20
#define PR_SET_NAME_ 15
#define SA_SIGINFO_ 4

/* CPUX86State: regs[16] first (RAX RCX RDX RBX RSP RBP RSI RDI R8..R15), then EIP */
#define CPU_RSP 4
#define CPU_RDI 7

/* The x86-64 signal frame QEMU writes (linux-user/i386/signal.c, as the kernel's):
   pretcode, then the ucontext (flags, link, stack: 40 bytes; the sigcontext: r8..r15, rdi,
   rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, ...), then the siginfo. */
#define FRAME_RIP (8 + 40 + 16 * 8)
#define FRAME_SIGINFO (8 + 304)

#define FIRST_CHUNK (64u << 10)
#define MAX_CHUNK (4u << 20)
#define SIDEBAND_LEAD_NS 10000
#define BUDGET_GRANT (1 << 20)

/* -- configuration (plugin arguments, docs/emulated-pt.md) ---------------------------------- */

static struct {
	char dir[PATH_MAX];
	char comm[16];
	uint32_t argc;
	pid_t watch_pid;
	unsigned long long watch_start;
	char rawlog[PATH_MAX];
	uint64_t psb_period, limit, chunk;
	uint64_t cpi, syscall_cycles, start_tsc, time_shift, time_mult, ratio, cyc_threshold;
} cfg = {
	.psb_period = 4096, .chunk = FIRST_CHUNK, .cpi = 1, .syscall_cycles = 100,
	.start_tsc = 2000000000ULL, .time_shift = 31, .time_mult = 1ULL << 30, .ratio = 20,
	.cyc_threshold = 1,
};

static uint64_t tsc_ns(uint64_t tsc)
{
	uint64_t q = tsc >> cfg.time_shift, r = tsc & ((1ULL << cfg.time_shift) - 1);
	return q * cfg.time_mult + ((r * cfg.time_mult) >> cfg.time_shift);
}

/* perf time of a thread clock value */
static uint64_t clock_ns(uint64_t now) { return tsc_ns(cfg.start_tsc + now); }

/* -- blocks --------------------------------------------------------------------------------- */

#define BF_REP 0x1       /* ends with a rep string instruction (QEMU: one block per iteration) */
#define BF_ZERO_CALL 0x2 /* ends with call +0: no return address is pushed */
#define BF_ANON 0x4      /* in memory no file backs: its code is in jitted-code.bin */
#define BF_HANDLER 0x8   /* starts at a signal handler */

/* One translation's facts; immutable but for BF_HANDLER. Shared by identical translations. */
struct block {
	uint64_t pc;     /* first instruction */
	uint64_t last;   /* last instruction */
	uint64_t end;    /* after the last instruction: fall-through, return address */
	uint64_t target; /* of a direct branch */
	uint32_t n;      /* instructions */
	uint8_t kind;    /* enum branch_kind of the last instruction */
	uint8_t flags;
	uint16_t nbytes;
	struct block *chain;
	uint8_t lens[];  /* n instruction lengths, then the nbytes of code */
};

static struct {
	pthread_mutex_t lock;
	struct block **buckets;
	size_t nbuckets, count;
} blocks = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t pc_bucket(uint64_t pc, size_t n)
{
	return (size_t)((pc * 0x9e3779b97f4a7c15ULL) >> 32) & (n - 1);
}

/* Index of the instruction at `addr` in `b`, or -1. */
static int insn_index(const struct block *b, uint64_t addr)
{
	uint64_t at = b->pc;
	for (uint32_t k = 0; k < b->n; k++) {
		if (at == addr)
			return (int)k;
		at += b->lens[k];
	}
	return -1;
}

static void blocks_grow(void)
{
	size_t n = blocks.nbuckets ? blocks.nbuckets * 2 : 1 << 14;
	struct block **b = calloc(n, sizeof *b);
	if (!b)
		return;
	for (size_t k = 0; k < blocks.nbuckets; k++)
		for (struct block *p = blocks.buckets[k], *next; p; p = next) {
			next = p->chain;
			size_t i = pc_bucket(p->pc, n);
			p->chain = b[i];
			b[i] = p;
		}
	free(blocks.buckets);
	blocks.buckets = b;
	blocks.nbuckets = n;
}

/* -- the process and its threads ------------------------------------------------------------- */

struct thread {
	struct pt_writer w;
	struct emu_slot *slot;
	struct block *cur;  /* the block entered last */
	uint32_t cur_done;  /* instructions of `cur` counted so far */
	int in_syscall;     /* the syscall callback wrote TIP.PGD: tracing is off */
	int stopped;        /* nothing more is traced on this thread */
	uint64_t *env;      /* the CPU state (CPUX86State), see the top of this file */
	uint32_t pid, tid, ptid, queue;
	int64_t budget;     /* instructions it may still run before asking for more */
	uint64_t chunk_size;
	uint8_t *map;       /* the mapping of the current chunk */
	size_t map_len;
	uint64_t payload;   /* the current chunk's file offset */
	int64_t sc_num;     /* the system call in progress */
	uint64_t sc_arg[6];
	uint64_t generation; /* the process generation it belongs to (forks) */
	char name[16];
	struct thread *next;
	int exited;
};

static __thread struct thread *self __attribute__((tls_model("initial-exec")));

struct file_range {
	uint64_t start, end;
};

struct clone_record {
	uint32_t tid, ptid;
	uint64_t now;
	char name[16];
};

static struct {
	pthread_mutex_t lock; /* threads, ranges, signals, comm fds, clones */
	uint32_t pid;
	uint64_t generation;
	int started;
	struct thread *threads;
	struct file_range *ranges;
	size_t nranges, cap_ranges;
	struct {
		uint64_t handler, flags, restorer;
	} sig[65];
	struct {
		int fd;
		uint32_t tid;
	} comm_fds[32];
	struct clone_record clones[64];
	unsigned nclones;
	struct code_pages jit;
	uint32_t fork_parent; /* in a forked child: the parent's pid */
} proc = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t guest_base;
static int guest_base_known;
static int registers_ok; /* the CPU state pointer passed its check */
static volatile int stopping;
static char jit_path[PATH_MAX + 32];
static uint32_t first_pid;

static void stop_recording(uint32_t flag, const char *why);
static void stop_process(void);

/* Read guest memory without risking a fault in QEMU's process. */
static int guest_read(uint64_t addr, void *out, size_t n)
{
	struct iovec local = {out, n};
	struct iovec remote = {(void *)(uintptr_t)(guest_base + addr), n};
	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n ? 0 : -1;
}

static uint32_t gettid_(void) { return (uint32_t)syscall(SYS_gettid); }

/* -- output ----------------------------------------------------------------------------------- */

static void append(const uint8_t *records, size_t len)
{
	if (len && pf_append(records, len) != 0)
		stop_recording(errno == ENOSPC ? EMU_DISK_FULL : EMU_FAILED,
			       errno == ENOSPC ? "the disk is full" : strerror(errno));
}

/* The earliest clock of the process's live threads: a mapping is dated so that no thread
   can have run code from it before (docs/emulated-pt.md, "The cycle model"). Lock held. */
static uint64_t earliest_clock_ns(void)
{
	uint64_t min = UINT64_MAX;
	for (struct thread *t = proc.threads; t; t = t->next) {
		uint64_t now = t->slot ? __atomic_load_n(&t->slot->now, __ATOMIC_RELAXED) : 0;
		if (!t->exited && now < min)
			min = now;
	}
	return clock_ns(min == UINT64_MAX ? 0 : min) - 1;
}

/* Start the next chunk of the thread's stream (the first, or after a full one). The old
   one keeps its provisional end until the new one is there, so a failure (a full disk)
   leaves the stream ending where the thread was. */
NOINLINE static int next_chunk(struct thread *t)
{
	struct pt_writer *w = &t->w;
	uint64_t offset = w->chunk_start + w->cap;
	uint64_t size = t->chunk_size;
	uint64_t payload = pf_reserve_chunk(t->pid, t->tid, clock_ns(w->now), t->queue, offset,
					    size, cfg.start_tsc + w->now);
	if (!payload) {
		stop_recording(errno == ENOSPC ? EMU_DISK_FULL : EMU_FAILED,
			       errno == ENOSPC ? "the disk is full" : strerror(errno));
		return -1;
	}
	int fd = open(pf_path(), O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		stop_recording(EMU_FAILED, strerror(errno));
		return -1;
	}
	uint64_t base = payload & ~4095ULL;
	size_t len = (size_t)(payload - base + size);
	void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
	close(fd);
	if (map == MAP_FAILED) {
		stop_recording(EMU_FAILED, strerror(errno));
		return -1;
	}
	if (w->buf) {
		/* The stream goes on in the new chunk: no provisional end in the old one. */
		size_t left = w->cap - w->pos;
		memset(w->buf + w->pos, 0, left < PT_TAIL_BYTES ? left : PT_TAIL_BYTES);
		munmap(t->map, t->map_len);
	}
	if (t->chunk_size < MAX_CHUNK)
		t->chunk_size *= 2;
	t->map = map;
	t->map_len = len;
	t->payload = payload;
	w->buf = (uint8_t *)map + (payload - base);
	w->pos = 0;
	w->cap = size;
	w->chunk_start = offset;
	return 0;
}

/* Room for one more block's packets in the current chunk (or a new chunk): 0, or -1. */
static inline int room(struct thread *t)
{
	struct pt_writer *w = &t->w;
	if (LIKELY(w->pos + PT_BLOCK_ROOM <= w->cap))
		return 0;
	return next_chunk(t);
}

/* -- counting and the instruction budget -------------------------------------------------- */

/* Take more of the shared budget; 1 when it is spent (the recording stops). */
NOINLINE static int refill(struct thread *t, uint64_t need)
{
	struct emu_state *st = pf_state();
	if (!st->limit) {
		t->budget = INT64_MAX;
		return 0;
	}
	for (;;) {
		int64_t left = __atomic_load_n(&st->budget_left, __ATOMIC_RELAXED);
		if (left <= 0 || (uint64_t)left + (uint64_t)t->budget < need)
			break;
		int64_t want = left / 4 + 1;
		if (want > BUDGET_GRANT)
			want = BUDGET_GRANT;
		if ((uint64_t)want < need)
			want = (int64_t)need;
		if (want > left)
			want = left;
		if (__atomic_compare_exchange_n(&st->budget_left, &left, left - want, 0,
						__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			t->budget += want;
			if ((uint64_t)t->budget >= need)
				return 0;
		}
	}
	t->stopped = 1;
	stop_recording(EMU_LIMIT_REACHED, NULL);
	return 1;
}

/* `n` more instructions of the current block ran: 0, or 1 if the budget stopped it. */
static inline int count(struct thread *t, uint32_t n)
{
	if (UNLIKELY((uint64_t)t->budget < n) && refill(t, n))
		return 1;
	t->budget -= n;
	t->cur_done += n;
	t->w.now += (uint64_t)n * cfg.cpi;
	t->slot->insns += n;
	t->slot->now = t->w.now;
	return 0;
}

/* Count the current block's instructions before index `k` (those that ran). */
static inline int count_to(struct thread *t, uint32_t k)
{
	return k > t->cur_done ? count(t, k - t->cur_done) : 0;
}

/* Enter block `b`: it is the current block, and the stream's provisional end says so. */
static inline void enter(struct thread *t, struct block *b)
{
	t->cur = b;
	t->cur_done = 0;
	pt_tail(&t->w, b->pc);
}

/* -- transitions ------------------------------------------------------------------------------ */

static int valid_successor(const struct block *p, uint64_t pc)
{
	switch (p->kind) {
	case BK_OTHER:
	case BK_SYSCALL:
		return pc == p->end;
	case BK_COND:
		return pc == p->end || pc == p->target;
	case BK_JUMP:
	case BK_CALL:
		return pc == p->target;
	default:
		return 1;
	}
}

/* The packets of `p`'s last instruction going to `dest` (a valid successor). */
static void emit_branch(struct pt_writer *w, const struct block *p, uint64_t dest)
{
	switch (p->kind) {
	case BK_COND:
		pt_cond(w, dest == p->target && dest != p->end);
		break;
	case BK_CALL:
		if (!(p->flags & BF_ZERO_CALL))
			pt_push(w, p->end);
		break;
	case BK_RET:
		pt_ret(w, dest);
		break;
	case BK_CALL_IND:
		pt_indirect(w, dest);
		pt_push(w, p->end);
		break;
	case BK_JUMP_IND:
	case BK_OTHER_IND:
		pt_indirect(w, dest);
		break;
	default:
		break;
	}
}

/* The thread was interrupted before `ip` (FUP + TIP.PGD), then runs block `b` (a handler). */
static void interrupted(struct thread *t, uint64_t ip, struct block *b)
{
	pt_interrupt(&t->w, ip);
	t->w.now += cfg.syscall_cycles;
	pt_start(&t->w, b->pc);
	enter(t, b);
}

static int is_fault_signal(uint64_t sig)
{
	return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP;
}

/* Is block `b` a signal handler QEMU just entered? If so, write the interruption and
   return 1. The proof: the handler registered for the signal in RDI starts at `b`, and the
   word at RSP is its sa_restorer (a call would have pushed an address in its caller). */
static int signal_delivery(struct thread *t, struct block *b)
{
	if (!registers_ok || !t->env)
		return 0;
	uint64_t rsp = t->env[CPU_RSP], sig = t->env[CPU_RDI];
	if (sig < 1 || sig > 64 || proc.sig[sig].handler != b->pc)
		return 0;
	uint64_t frame[FRAME_RIP / 8 + 1];
	if (guest_read(rsp, frame, sizeof frame) != 0 || frame[0] != proc.sig[sig].restorer)
		return 0;
	uint64_t r = frame[FRAME_RIP / 8];
	int fault = is_fault_signal(sig);
	if (fault && (proc.sig[sig].flags & SA_SIGINFO_)) {
		int32_t code;
		if (guest_read(rsp + FRAME_SIGINFO + 8, &code, 4) == 0)
			fault = code > 0; /* a kernel-made signal; kill() and friends say <= 0 */
	}
	struct block *p = t->cur;
	int k = insn_index(p, r);
	if ((p->flags & BF_REP) && r == p->last) {
		if (count_to(t, p->n - 1)) /* the rep instruction has not finished */
			return 1;
	} else if (fault && k >= 0) {
		if (count_to(t, (uint32_t)k)) /* the instruction at r faulted */
			return 1;
	} else if (valid_successor(p, r)) {
		if (count_to(t, p->n))
			return 1;
		emit_branch(&t->w, p, r);
	} else if (k >= 0) {
		if (count_to(t, (uint32_t)k))
			return 1;
	} else {
		if (count_to(t, p->n - 1))
			return 1;
		r = p->last;
	}
	interrupted(t, r, b);
	return 1;
}

static void become_fork_child(struct thread *t);

/* After a system call: tracing starts again wherever the thread runs. */
static void resume(struct thread *t, struct block *b)
{
	struct pt_writer *w = &t->w;
	t->in_syscall = 0;
	if (UNLIKELY(t->generation != proc.generation)) {
		become_fork_child(t);
		if (t->stopped)
			return;
	}
	if (room(t) != 0)
		return;
	w->now += cfg.syscall_cycles;
	/* Waiting in the kernel (futex, read...) looks like waiting: the clock catches up
	   with the latest clock of the process's other threads. */
	pthread_mutex_lock(&proc.lock);
	for (struct thread *o = proc.threads; o; o = o->next) {
		uint64_t other = o->slot ? __atomic_load_n(&o->slot->now, __ATOMIC_RELAXED) : 0;
		if (o != t && !o->exited && other > w->now)
			w->now = other;
	}
	pthread_mutex_unlock(&proc.lock);
	t->slot->now = w->now;
	pt_start(&t->w, b->pc);
	enter(t, b);
}

/* Everything but the common transitions. */
NOINLINE static void slow_arrival(struct thread *t, struct block *b)
{
	struct pt_writer *w = &t->w;
	struct block *p = t->cur;
	uint64_t pc = b->pc;
	if (t->in_syscall) {
		resume(t, b);
		return;
	}
	if (room(t) != 0)
		return;
	if ((__atomic_load_n(&b->flags, __ATOMIC_RELAXED) & BF_HANDLER) && signal_delivery(t, b))
		return;
	if ((p->flags & BF_REP) && pc == p->last) {
		/* Another iteration of the rep string instruction: PT counts it once. */
		if (count_to(t, p->n - 1))
			return;
		t->cur = b;
		t->cur_done = b->n - 1;
		pt_tail(w, b->pc);
		return;
	}
	if (valid_successor(p, pc)) {
		if (count_to(t, p->n))
			return;
		emit_branch(w, p, pc);
		if ((p->flags & BF_ANON) && !(b->flags & BF_ANON))
			pt_request_psb(w); /* back from JIT code: a point to resynchronise at */
		pt_maybe_psb(w, pc);
		enter(t, b);
		return;
	}
	int k = insn_index(p, pc);
	if (k > 0 || (k == 0 && b->n < p->n)) {
		/* The previous block stopped early, before pc (QEMU steps an exclusive atomic
		   instruction in a block of its own): control simply went on. */
		if (count_to(t, (uint32_t)k))
			return;
		enter(t, b);
		return;
	}
	/* Unexplained: written like an interruption where the previous block was going. */
	uint64_t ip;
	if (p->kind == BK_OTHER || p->kind == BK_JUMP || p->kind == BK_CALL) {
		if (count_to(t, p->n))
			return;
		ip = p->kind == BK_OTHER ? p->end : p->target;
		emit_branch(w, p, ip);
	} else {
		if (count_to(t, p->n - 1))
			return;
		ip = p->last;
	}
	interrupted(t, ip, b);
}

static void first_block(struct thread *t, struct block *b, uint64_t *env);

/* Called by generated code (through block_entry_stub) every time a block starts. */
__attribute__((used, visibility("hidden"))) void on_block(unsigned int vcpu, void *udata,
							    uint64_t *env)
{
	struct block *b = udata;
	struct thread *t = self;
	(void)vcpu;
	if (UNLIKELY(t == NULL || t->cur == NULL)) {
		first_block(t, b, env);
		return;
	}
	if (UNLIKELY(t->stopped || stopping))
		return;
	struct pt_writer *w = &t->w;
	struct block *p = t->cur;
	uint64_t pc = b->pc;
	if (UNLIKELY(t->in_syscall || (__atomic_load_n(&b->flags, __ATOMIC_RELAXED) & BF_HANDLER)))
		goto slow;
	if (UNLIKELY(room(t) != 0))
		return;
	switch (p->kind) {
	case BK_OTHER:
		if (pc != p->end)
			goto slow;
		if (count_to(t, p->n))
			return;
		break;
	case BK_COND:
		if (pc != p->end && pc != p->target)
			goto slow;
		if (count_to(t, p->n))
			return;
		pt_cond(w, pc == p->target && pc != p->end);
		break;
	case BK_JUMP:
		if (pc != p->target)
			goto slow;
		if (count_to(t, p->n))
			return;
		break;
	case BK_CALL:
		if (pc != p->target)
			goto slow;
		if (count_to(t, p->n))
			return;
		if (!(p->flags & BF_ZERO_CALL))
			pt_push(w, p->end);
		break;
	case BK_RET:
		if (count_to(t, p->n))
			return;
		pt_ret(w, pc);
		break;
	case BK_CALL_IND:
		if (count_to(t, p->n))
			return;
		pt_indirect(w, pc);
		pt_push(w, p->end);
		break;
	case BK_JUMP_IND:
	case BK_OTHER_IND:
		if (count_to(t, p->n))
			return;
		pt_indirect(w, pc);
		break;
	default:
		goto slow;
	}
	if (UNLIKELY(p->flags & BF_ANON) && !(b->flags & BF_ANON))
		pt_request_psb(w);
	pt_maybe_psb(w, pc);
	enter(t, b);
	return;
slow:
	slow_arrival(t, b);
}

#if defined(__x86_64__)
/* TCG calls block callbacks with the CPU state pointer in RBP (TCG_AREG0): hand it over. */
__asm__(".text\n"
	".p2align 4\n"
	".type block_entry_stub,@function\n"
	"block_entry_stub:\n"
	"\tmovq %rbp, %rdx\n"
	"\tjmp on_block\n"
	".size block_entry_stub, .-block_entry_stub\n");
void block_entry_stub(unsigned int vcpu, void *udata);
#define BLOCK_CALLBACK block_entry_stub
#else
static void block_entry_plain(unsigned int vcpu, void *udata) { on_block(vcpu, udata, NULL); }
#define BLOCK_CALLBACK block_entry_plain
#endif

/* -- threads and processes ------------------------------------------------------------------- */

static struct emu_slot *new_slot(struct thread *t)
{
	struct emu_state *st = pf_state();
	uint32_t index = __atomic_fetch_add(&st->slot_count, 1, __ATOMIC_RELAXED);
	if (index >= st->slot_capacity)
		return NULL;
	struct emu_slot *s = pf_slot(index);
	s->pid = t->pid;
	s->tid = t->tid;
	s->ptid = t->ptid;
	s->queue = t->queue;
	s->now = t->w.now;
	__atomic_store_n(&s->flags, SLOT_LIVE, __ATOMIC_RELEASE);
	return s;
}

static void writer_init(struct pt_writer *w, uint64_t now)
{
	memset(w, 0, sizeof *w);
	w->now = now;
	w->last_timing = now;
	w->start_tsc = cfg.start_tsc;
	w->psb_period = cfg.psb_period;
	w->next_psb = cfg.psb_period;
	w->cyc_threshold = (uint32_t)cfg.cyc_threshold;
	w->ratio = (uint8_t)cfg.ratio;
}

static void add_range(uint64_t start, uint64_t end)
{
	if (proc.nranges == proc.cap_ranges) {
		size_t cap = proc.cap_ranges ? proc.cap_ranges * 2 : 32;
		struct file_range *r = realloc(proc.ranges, cap * sizeof *r);
		if (!r)
			return;
		proc.ranges = r;
		proc.cap_ranges = cap;
	}
	proc.ranges[proc.nranges++] = (struct file_range){start, end};
}

/* Forget the file-backed code in [start, end) (unmapped, or mapped over). Lock held. */
static void remove_ranges(uint64_t start, uint64_t end)
{
	size_t n = proc.nranges;
	for (size_t k = 0; k < n; k++) {
		struct file_range r = proc.ranges[k];
		if (r.end <= start || r.start >= end)
			continue;
		if (r.start < start && r.end > end) {
			proc.ranges[k].end = start;
			add_range(end, r.end);
		} else if (r.start < start) {
			proc.ranges[k].end = start;
		} else if (r.end > end) {
			proc.ranges[k].start = end;
		} else {
			proc.ranges[k] = proc.ranges[--proc.nranges];
			n = proc.nranges;
			k--;
		}
	}
}

static int file_backed(uint64_t pc)
{
	int found = 0;
	pthread_mutex_lock(&proc.lock);
	for (size_t k = 0; k < proc.nranges && !found; k++)
		found = proc.ranges[k].start <= pc && pc < proc.ranges[k].end;
	pthread_mutex_unlock(&proc.lock);
	return found;
}

/* MMAP2 records for an ELF image's executable segments loaded with `bias`. Lock held. */
static size_t map_image(uint8_t *out, const char *path, const struct elf_facts *e, uint64_t bias,
			uint64_t time)
{
	size_t n = 0;
	for (int k = 0; k < e->nexec; k++) {
		const struct elf_segment *s = &e->exec[k];
		add_range(s->vaddr + bias, s->vaddr + bias + s->size);
		n += pf_mmap2(out + n, proc.pid, proc.pid, s->vaddr + bias, s->size, s->offset, path,
			      time);
	}
	pf_add_build_id(path, e->build_id, (size_t)e->build_id_len);
	return n;
}

/* The program's first block: check the CPU state pointer, describe the process. */
static void start_process(uint64_t *env)
{
	static uint8_t rec[4 * ELF_MAX_EXEC_SEGMENTS * (PATH_MAX + 128)];
	uint64_t argc = 0;
	registers_ok = env && guest_read(env[CPU_RSP], &argc, 8) == 0 && argc == cfg.argc;
	if (!registers_ok) {
		struct emu_state *st = pf_state();
		__atomic_or_fetch(&st->flags, EMU_NO_REGISTERS, __ATOMIC_RELAXED);
	}
	char exe[PATH_MAX], interp[PATH_MAX];
	const char *given = qemu_plugin_path_to_binary();
	struct elf_facts e, ie;
	uint64_t t0 = clock_ns(0) - SIDEBAND_LEAD_NS;
	size_t n = pf_comm(rec, proc.pid, proc.pid, cfg.comm, t0, 1);
	if (given && realpath(given, exe) && elf_read(exe, &e) == 0) {
		uint64_t start_code = qemu_plugin_start_code();
		uint64_t bias = e.dyn ? (start_code - e.lowest_exec_vaddr) & ~4095ULL : 0;
		n += map_image(rec + n, exe, &e, bias, t0);
		if (e.interp[0] && realpath(e.interp, interp) && elf_read(interp, &ie) == 0)
			n += map_image(rec + n, interp, &ie, qemu_plugin_entry_code() - ie.entry, t0);
	}
	append(rec, n);
	proc.started = 1;
}

static int clone_lookup(uint32_t tid, struct clone_record *out)
{
	for (unsigned k = 0; k < proc.nclones && k < 64; k++)
		if (proc.clones[k].tid == tid) {
			*out = proc.clones[k];
			return 1;
		}
	return 0;
}

static void announce(struct thread *t, int fork_record)
{
	uint8_t rec[256];
	uint64_t start = clock_ns(t->w.now);
	size_t n = 0;
	if (fork_record) {
		uint32_t ppid = t->pid == t->tid ? proc.fork_parent : t->pid;
		n += pf_fork_exit(rec + n, 0, t->pid, ppid, t->tid, t->ptid, start - 2);
		n += pf_comm(rec + n, t->pid, t->tid, t->name, start - 1, 0);
	}
	n += pf_itrace_start(rec + n, t->pid, t->tid, start - 1);
	append(rec, n);
}

/* A thread's first block (the program's first, a new thread's, a forked child's first). */
NOINLINE static void first_block(struct thread *t, struct block *b, uint64_t *env)
{
	if (stopping)
		return;
	if (t == NULL) {
		t = calloc(1, sizeof *t);
		if (!t)
			return;
		t->pid = (uint32_t)getpid();
		t->tid = gettid_();
		t->generation = proc.generation;
		t->chunk_size = cfg.chunk;
		t->env = env;
		uint64_t now = 0;
		pthread_mutex_lock(&proc.lock);
		int main_thread = !proc.started;
		if (main_thread) {
			start_process(env);
			t->ptid = t->pid;
			memcpy(t->name, cfg.comm, sizeof t->name);
		}
		pthread_mutex_unlock(&proc.lock);
		if (!main_thread) {
			/* A new thread runs only after its creator's clone() returned in QEMU,
			   but the creator's syscall_ret callback may come a moment later. */
			struct clone_record c;
			int found = 0;
			for (int tries = 0; tries < 20000 && !found; tries++) {
				pthread_mutex_lock(&proc.lock);
				found = clone_lookup(t->tid, &c);
				pthread_mutex_unlock(&proc.lock);
				if (!found) {
					struct timespec ts = {0, 50000};
					nanosleep(&ts, NULL);
				}
			}
			if (found) {
				t->ptid = c.ptid;
				now = c.now;
				memcpy(t->name, c.name, sizeof t->name);
			} else {
				t->ptid = t->pid;
				memcpy(t->name, cfg.comm, sizeof t->name);
				pthread_mutex_lock(&proc.lock);
				for (struct thread *o = proc.threads; o; o = o->next) {
					uint64_t other = o->slot ? __atomic_load_n(&o->slot->now,
										   __ATOMIC_RELAXED)
								 : 0;
					if (!o->exited && other > now)
						now = other;
				}
				pthread_mutex_unlock(&proc.lock);
			}
		}
		writer_init(&t->w, now);
		struct emu_state *st = pf_state();
		t->queue = (uint32_t)__atomic_fetch_add(&st->queues, 1, __ATOMIC_RELAXED);
		t->budget = 0;
		t->slot = new_slot(t);
		if (!t->slot) {
			free(t);
			stop_recording(EMU_FAILED, "too many threads");
			return;
		}
		pthread_mutex_lock(&proc.lock);
		t->next = proc.threads;
		proc.threads = t;
		pthread_mutex_unlock(&proc.lock);
		self = t;
		announce(t, !main_thread);
	}
	t->env = env;
	if (next_chunk(t) != 0)
		return;
	pt_start(&t->w, b->pc);
	enter(t, b);
}

/* In a forked child, at the return of fork(): the thread that forked is this process's
   only thread, with a stream of its own from here. */
static void become_fork_child(struct thread *t)
{
	uint32_t forker = t->tid;
	t->generation = proc.generation;
	t->pid = (uint32_t)getpid();
	t->tid = gettid_();
	t->ptid = forker;
	t->map = NULL; /* the parent's chunk was unmapped at the fork */
	uint64_t now = t->w.now;
	writer_init(&t->w, now);
	t->chunk_size = cfg.chunk;
	t->budget = 0;
	struct emu_state *st = pf_state();
	t->queue = (uint32_t)__atomic_fetch_add(&st->queues, 1, __ATOMIC_RELAXED);
	t->slot = new_slot(t);
	if (!t->slot) {
		t->stopped = 1;
		return;
	}
	announce(t, 1);
}

/* The thread is gone (its exit, or the end of the process): its EXIT record. */
static void finish_thread(struct thread *t, uint8_t *rec, size_t *n)
{
	if (t->exited)
		return;
	t->exited = 1;
	uint32_t ppid = t->pid == t->tid ? (proc.fork_parent ? proc.fork_parent : 0) : t->pid;
	if (t->slot) {
		*n += pf_fork_exit(rec + *n, 1, t->pid, ppid, t->tid, t->ptid, clock_ns(t->w.now) + 1);
		__atomic_or_fetch(&t->slot->flags, SLOT_EXITED, __ATOMIC_RELEASE);
	}
}

/* The thread's stream is over: give back the disk space its last chunk did not use (it
   reads as zeros, PAD packets, as before). */
static void release_chunk(struct thread *t)
{
	struct pt_writer *w = &t->w;
	if (!t->map)
		return;
	uint64_t used = (t->payload + w->pos + PT_TAIL_BYTES + 4095) & ~4095ULL;
	uint64_t end = (t->payload + w->cap) & ~4095ULL;
	munmap(t->map, t->map_len);
	t->map = NULL;
	w->buf = NULL;
	if (used >= end)
		return;
	int fd = open(pf_path(), O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)used,
			  (off_t)(end - used));
		close(fd);
	}
}

static void on_vcpu_exit(qemu_plugin_id_t id, unsigned int vcpu)
{
	(void)id, (void)vcpu;
	struct thread *t = self;
	if (!t)
		return;
	uint8_t rec[128];
	size_t n = 0;
	pthread_mutex_lock(&proc.lock);
	finish_thread(t, rec, &n);
	pthread_mutex_unlock(&proc.lock);
	append(rec, n);
	release_chunk(t);
	self = NULL;
}

static void on_exit_(qemu_plugin_id_t id, void *data)
{
	(void)id, (void)data;
	stopping = 1;
	pthread_mutex_lock(&proc.lock);
	size_t count = 0;
	for (struct thread *t = proc.threads; t; t = t->next)
		count++;
	uint8_t *rec = malloc(count * 128 + 1);
	size_t n = 0;
	if (rec)
		for (struct thread *t = proc.threads; t; t = t->next)
			finish_thread(t, rec, &n);
	pthread_mutex_unlock(&proc.lock);
	if (rec)
		append(rec, n);
	free(rec);
	if (self && self->in_syscall) /* the thread that ends the process: its stream is over */
		release_chunk(self);
	if (proc.pid == first_pid)
		__atomic_or_fetch(&pf_state()->flags, EMU_EXITED, __ATOMIC_RELAXED);
}

/* Kill this process (QEMU and the program), but first let the other threads finish the
   block they may be writing packets for: blocks take nanoseconds, and none starts once
   `stopping` is set, so every stream ends on its provisional end, not on half a block. */
static void stop_process(void)
{
	stopping = 1;
	struct timespec ts = {0, 20 * 1000 * 1000};
	nanosleep(&ts, NULL);
	kill(getpid(), SIGKILL);
}

/* Stop: the recording cannot go on (budget spent, disk full, an error). What is in the
   file stays a valid recording; the program is stopped with it. */
static void stop_recording(uint32_t flag, const char *why)
{
	struct emu_state *st = pf_state();
	stopping = 1;
	if (why && !(__atomic_fetch_or(&st->flags, flag, __ATOMIC_RELAXED) & EMU_FAILED) &&
	    !st->error[0])
		snprintf(st->error, sizeof st->error, "%s", why);
	else
		__atomic_or_fetch(&st->flags, flag, __ATOMIC_RELAXED);
	stop_process();
}

/* -- translation ------------------------------------------------------------------------------- */

static void jit_page_mapped(uint64_t page, uint64_t file_offset, void *ctx)
{
	(void)ctx;
	uint8_t rec[PATH_MAX + 128];
	pthread_mutex_lock(&proc.lock);
	size_t n = pf_mmap2(rec, proc.pid, proc.pid, page, 4096, file_offset, jit_path,
			    earliest_clock_ns());
	pthread_mutex_unlock(&proc.lock);
	append(rec, n);
}

static int is_handler(uint64_t pc)
{
	for (int s = 1; s <= 64; s++)
		if (proc.sig[s].handler == pc)
			return 1;
	return 0;
}

/* QEMU 7.2 starts translating an instruction, finds that it crosses into the next page
   (or starts there) while the block has instructions already, and leaves it for the next
   block, but the plugin's list of the block's instructions keeps it, with the bytes read
   so far: up to the boundary, or fewer when the read that crossed it was several bytes
   wide (`call *disp32(%rip)` 3 bytes before the boundary: its disp32 read crosses, and only
   the opcode and ModRM are kept). Such an instruction is incomplete, or reaches into the
   next page. */
static int phantom(const uint8_t *code, size_t size, uint64_t vaddr)
{
	if (size == 0)
		return 1;
	if ((vaddr >> 12) != ((vaddr + size - 1) >> 12))
		return 1;
	return (vaddr & 4095) + PTSCOPE_X86_MAX_LENGTH > 4096 && ptscope_x86_length(code, size) < 0;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	(void)id;
	static uint8_t code[16 * 512];
	static uint8_t lens[512];
	size_t n = qemu_plugin_tb_n_insns(tb);
	if (n == 0 || n > 512)
		return;
	size_t total = 0;
	uint64_t pc = 0, last = 0;
	pthread_mutex_lock(&blocks.lock);
	for (size_t k = 0; k < n; k++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, k);
		size_t size = qemu_plugin_insn_size(insn);
		uint64_t vaddr = qemu_plugin_insn_vaddr(insn);
		if (k == 0) {
			pc = vaddr;
			if (!guest_base_known) {
				guest_base = (uint64_t)(uintptr_t)qemu_plugin_insn_haddr(insn) - vaddr;
				guest_base_known = 1;
			}
		}
		if (size > 15 || total + size > sizeof code) {
			pthread_mutex_unlock(&blocks.lock);
			return;
		}
		if (k > 0 && k == n - 1 && phantom(qemu_plugin_insn_data(insn), size, vaddr)) {
			n--; /* QEMU left it for the next block */
			break;
		}
		memcpy(code + total, qemu_plugin_insn_data(insn), size);
		lens[k] = (uint8_t)size;
		last = vaddr;
		total += size;
	}
	/* An identical translation (QEMU flushed its cache, or runs the block under other
	   flags) shares the facts. */
	if (!blocks.nbuckets || blocks.count >= blocks.nbuckets)
		blocks_grow();
	size_t i = pc_bucket(pc, blocks.nbuckets);
	struct block *b;
	for (b = blocks.buckets[i]; b; b = b->chain)
		if (b->pc == pc && b->n == n && b->nbytes == total && memcmp(b->lens, lens, n) == 0 &&
		    memcmp(b->lens + n, code, total) == 0)
			break;
	int fresh = b == NULL;
	if (fresh) {
		struct branch_info bi;
		x86_classify(code + total - lens[n - 1], lens[n - 1], last, &bi);
		b = malloc(sizeof *b + n + total);
		if (!b) {
			pthread_mutex_unlock(&blocks.lock);
			return;
		}
		b->pc = pc;
		b->last = last;
		b->end = pc + total;
		b->target = bi.target;
		b->n = (uint32_t)n;
		b->kind = bi.kind;
		b->flags = (uint8_t)((bi.rep ? BF_REP : 0) | (bi.zero_call ? BF_ZERO_CALL : 0));
		b->nbytes = (uint16_t)total;
		memcpy(b->lens, lens, n);
		memcpy(b->lens + n, code, total);
		pthread_mutex_lock(&proc.lock);
		if (is_handler(pc))
			b->flags |= BF_HANDLER;
		pthread_mutex_unlock(&proc.lock);
		b->chain = blocks.buckets[i];
		blocks.buckets[i] = b;
		blocks.count++;
	}
	pthread_mutex_unlock(&blocks.lock);
	if (fresh && proc.started && !file_backed(pc)) {
		b->flags |= BF_ANON;
		uint64_t at = pc;
		for (size_t k = 0, off = 0; k < n; off += lens[k], at += lens[k], k++)
			code_pages_add(&proc.jit, jit_path, at, b->lens + n + off, lens[k],
				       jit_page_mapped, NULL);
	}
	qemu_plugin_register_vcpu_tb_exec_cb(tb, BLOCK_CALLBACK, QEMU_PLUGIN_CB_NO_REGS, b);
}

/* -- system calls --------------------------------------------------------------------------------- */

static void rename_thread(uint32_t tid, const char *name, uint64_t fallback_now)
{
	uint8_t rec[128];
	uint64_t now = fallback_now;
	char clean[16] = {0};
	strncpy(clean, name, 15);
	pthread_mutex_lock(&proc.lock);
	for (struct thread *o = proc.threads; o; o = o->next)
		if (o->tid == tid && !o->exited) {
			memcpy(o->name, clean, sizeof o->name);
			if (o->slot)
				now = __atomic_load_n(&o->slot->now, __ATOMIC_RELAXED);
		}
	pthread_mutex_unlock(&proc.lock);
	append(rec, pf_comm(rec, proc.pid, tid, clean, clock_ns(now), 0));
}

/* Which thread's name a /proc path opened for writing names: 0 if none. */
static uint32_t comm_file_tid(const char *path, uint32_t caller)
{
	size_t len = strlen(path);
	if (len < 5 || strcmp(path + len - 5, "/comm") != 0 || strncmp(path, "/proc/", 6) != 0)
		return 0;
	const char *p = path + 6;
	unsigned pid = 0, tid = 0;
	int used = 0;
	if (strcmp(p, "thread-self/comm") == 0)
		return caller;
	if (strncmp(p, "self/", 5) == 0) {
		pid = proc.pid;
		p += 5;
	} else if (sscanf(p, "%u/%n", &pid, &used) == 1 && used > 0) {
		p += used;
	} else {
		return 0;
	}
	if (strcmp(p, "comm") == 0)
		return pid;
	used = 0;
	if (sscanf(p, "task/%u/comm%n", &tid, &used) == 1 && p[used] == 0)
		return tid;
	return 0;
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1,
		       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7,
		       uint64_t a8)
{
	(void)id, (void)vcpu, (void)a7, (void)a8;
	struct thread *t = self;
	if (!t || t->stopped || stopping)
		return;
	t->sc_num = num;
	uint64_t args[6] = {a1, a2, a3, a4, a5, a6};
	memcpy(t->sc_arg, args, sizeof args);
	/* The system call instruction ran: tracing stops (user-only tracing). */
	if (t->cur && !t->in_syscall) {
		if (count_to(t, t->cur->n))
			return;
		if (t->w.enabled)
			pt_disable(&t->w);
		pt_tail(&t->w, 0);
		t->in_syscall = 1;
	}
	switch (num) {
	case SYS_rt_sigaction_:
		if (a1 >= 1 && a1 <= 64 && a2) {
			uint64_t act[3];
			if (guest_read(a2, act, sizeof act) == 0) {
				pthread_mutex_lock(&proc.lock);
				proc.sig[a1].handler = act[0];
				proc.sig[a1].flags = act[1];
				proc.sig[a1].restorer = act[2];
				pthread_mutex_unlock(&proc.lock);
				pthread_mutex_lock(&blocks.lock);
				for (struct block *b = blocks.nbuckets ? blocks.buckets[pc_bucket(
							  act[0], blocks.nbuckets)]
								  : NULL;
				     b; b = b->chain)
					if (b->pc == act[0])
						__atomic_or_fetch(&b->flags, BF_HANDLER,
								  __ATOMIC_RELAXED);
				pthread_mutex_unlock(&blocks.lock);
			}
		}
		break;
	case SYS_prctl_:
		if (a1 == PR_SET_NAME_) {
			char name[16] = {0};
			if (guest_read(a2, name, 15) == 0 || guest_read(a2, name, 1) == 0)
				rename_thread(t->tid, name, t->w.now);
		}
		break;
	case SYS_write_: {
		uint32_t tid = 0;
		pthread_mutex_lock(&proc.lock);
		for (int k = 0; k < 32; k++)
			if (proc.comm_fds[k].tid && proc.comm_fds[k].fd == (int)a1)
				tid = proc.comm_fds[k].tid;
		pthread_mutex_unlock(&proc.lock);
		if (tid && a3 > 0) {
			char name[17] = {0};
			size_t len = a3 < 16 ? (size_t)a3 : 16;
			if (guest_read(a2, name, len) == 0) {
				name[strcspn(name, "\n")] = 0;
				rename_thread(tid, name, t->w.now);
			}
		}
		break;
	}
	case SYS_exit_group_:
		if (proc.pid == first_pid)
			pf_state()->exit_code = (int32_t)a1;
		break;
	default:
		break;
	}
}

/* A library (or any ELF file) mapped executable: its MMAP2 record. */
static void map_file(uint64_t addr, uint64_t len, uint64_t offset, int fd)
{
	char link[64], path[PATH_MAX];
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	if (n <= 0)
		return;
	path[n] = 0;
	struct elf_facts e;
	if (elf_read(path, &e) != 0)
		return; /* not code perf could read: it runs as anonymous code */
	uint64_t start = addr & ~4095ULL;
	uint64_t end = (addr + len + 4095) & ~4095ULL;
	static uint8_t rec[PATH_MAX + 128];
	pthread_mutex_lock(&proc.lock);
	add_range(start, end);
	size_t size = pf_mmap2(rec, proc.pid, proc.pid, start, end - start, offset & ~4095ULL, path,
			       earliest_clock_ns());
	append(rec, size);
	pthread_mutex_unlock(&proc.lock);
	pf_add_build_id(path, e.build_id, (size_t)e.build_id_len);
}

static void on_syscall_ret(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, int64_t ret)
{
	(void)id, (void)vcpu;
	struct thread *t = self;
	if (!t || stopping || num != t->sc_num)
		return;
	const uint64_t *a = t->sc_arg;
	switch (num) {
	case SYS_clone_:
		if (ret > 0 && (a[0] & CLONE_VM_)) {
			pthread_mutex_lock(&proc.lock);
			struct clone_record *c = &proc.clones[proc.nclones++ % 64];
			c->tid = (uint32_t)ret;
			c->ptid = t->tid;
			c->now = t->w.now + cfg.syscall_cycles;
			memcpy(c->name, t->name, sizeof c->name);
			pthread_mutex_unlock(&proc.lock);
		}
		break;
	case SYS_mmap_:
		if (ret >= 0 && (uint64_t)ret < (1ULL << 56)) {
			uint64_t start = (uint64_t)ret & ~4095ULL;
			pthread_mutex_lock(&proc.lock);
			remove_ranges(start, (uint64_t)ret + ((a[1] + 4095) & ~4095ULL));
			pthread_mutex_unlock(&proc.lock);
			if ((a[2] & PROT_EXEC_) && !(a[3] & MAP_ANONYMOUS_) && (int32_t)a[4] >= 0)
				map_file((uint64_t)ret, a[1], a[5], (int)a[4]);
		}
		break;
	case SYS_munmap_:
		if (ret == 0) {
			pthread_mutex_lock(&proc.lock);
			remove_ranges(a[0] & ~4095ULL, a[0] + a[1]);
			pthread_mutex_unlock(&proc.lock);
		}
		break;
	case SYS_open_:
	case SYS_openat_:
		if (ret >= 0) {
			char path[256] = {0};
			uint64_t ptr = num == SYS_openat_ ? a[1] : a[0];
			for (size_t k = 0; k < sizeof path - 1; k += 16)
				if (guest_read(ptr + k, path + k, 16) != 0 || memchr(path + k, 0, 16))
					break;
			path[sizeof path - 1] = 0;
			uint32_t tid = comm_file_tid(path, t->tid);
			if (tid) {
				pthread_mutex_lock(&proc.lock);
				for (int k = 0; k < 32; k++)
					if (!proc.comm_fds[k].tid) {
						proc.comm_fds[k].fd = (int)ret;
						proc.comm_fds[k].tid = tid;
						break;
					}
				pthread_mutex_unlock(&proc.lock);
			}
		}
		break;
	case SYS_close_:
		pthread_mutex_lock(&proc.lock);
		for (int k = 0; k < 32; k++)
			if (proc.comm_fds[k].fd == (int)a[0])
				proc.comm_fds[k].tid = 0;
		pthread_mutex_unlock(&proc.lock);
		break;
	default:
		break;
	}
}

/* -- fork ----------------------------------------------------------------------------------------- */

static uint32_t pid_before_fork;

static void atfork_prepare(void)
{
	pid_before_fork = (uint32_t)getpid();
	pthread_mutex_lock(&blocks.lock);
	pthread_mutex_lock(&proc.lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&proc.lock);
	pthread_mutex_unlock(&blocks.lock);
}

static void start_watcher(void);

/* QEMU's log of a forked child goes to LOG.<pid> (tests read each process's log). */
static void split_raw_log(void)
{
	struct stat log, st;
	if (!cfg.rawlog[0] || stat(cfg.rawlog, &log) != 0)
		return;
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s.%d", cfg.rawlog, (int)getpid());
	int fresh = -1;
	for (int fd = 0; fd < 4096; fd++) {
		if (fstat(fd, &st) != 0 || st.st_dev != log.st_dev || st.st_ino != log.st_ino)
			continue;
		if (fresh < 0)
			fresh = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fresh >= 0)
			dup2(fresh, fd);
	}
	if (fresh >= 0)
		close(fresh);
}

static void atfork_child(void)
{
	pthread_mutex_init(&proc.lock, NULL);
	pthread_mutex_init(&blocks.lock, NULL);
	/* Only the forking thread lives on; the parent's chunks are the parent's. */
	struct thread *me = self;
	for (struct thread *t = proc.threads; t; t = t->next)
		if (t->map) {
			munmap(t->map, t->map_len);
			t->map = NULL;
			t->w.buf = NULL;
		}
	proc.threads = me;
	if (me)
		me->next = NULL;
	proc.fork_parent = pid_before_fork;
	proc.pid = (uint32_t)getpid();
	proc.generation++;
	proc.nclones = 0;
	split_raw_log();
	start_watcher();
}

/* -- watching ptscope --------------------------------------------------------------------------------- */

/* Is the process that started the recording still there (and not a zombie)? */
static int watched_alive(void)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)cfg.watch_pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return 0;
	if (p[2] == 'Z' || p[2] == 'X')
		return 0;
	if (cfg.watch_start) {
		/* field 22 (starttime), counting from the state (field 3) */
		unsigned long long start = 0;
		const char *q = p + 2;
		for (int field = 3; field < 22 && q; field++) {
			q = strchr(q, ' ');
			if (q)
				q++;
		}
		if (!q || sscanf(q, "%llu", &start) != 1 || start != cfg.watch_start)
			return 0;
	}
	return 1;
}

static void *watch(void *arg)
{
	(void)arg;
	for (;;) {
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL);
		if (!watched_alive()) {
			/* ptscope is gone: stop the program rather than let it run untraced. The
			   recording is complete up to here (provisional ends). */
			stop_process();
		}
	}
	return NULL;
}

static void start_watcher(void)
{
	if (cfg.watch_pid <= 0)
		return;
	sigset_t all, old;
	pthread_t thread;
	pthread_attr_t attr;
	sigfillset(&all);
	/* No signal may land on this thread: QEMU's handlers expect a vCPU thread. */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 << 10);
	pthread_create(&thread, &attr, watch, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* -- installation ------------------------------------------------------------------------------------- */

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *s == 0 || *end != 0)
		return -1;
	*out = v;
	return 0;
}

/* The guest's command line, for perf's CMDLINE feature: QEMU's own command line ends with
   PROGRAM ARGS..., and ptscope passes `-0 ARGV0` right before them. */
static char **guest_cmdline(void)
{
	static char buf[1 << 16];
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	buf[n] = 0;
	char *items[4096];
	int count = 0;
	for (char *p = buf; p < buf + n && count < 4096; p += strlen(p) + 1)
		items[count++] = p;
	if (cfg.argc == 0 || cfg.argc > (uint32_t)count)
		return NULL;
	int program = count - (int)cfg.argc;
	char **out = calloc(cfg.argc + 1, sizeof *out);
	if (!out)
		return NULL;
	out[0] = program >= 2 && strcmp(items[program - 2], "-0") == 0 ? items[program - 1]
								       : items[program];
	for (uint32_t k = 1; k < cfg.argc; k++)
		out[k] = items[program + (int)k];
	return out;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
					   char **argv)
{
	if (info->system_emulation) {
		fprintf(stderr, "ptscope: the recorder runs under QEMU user mode only\n");
		return -1;
	}
	for (int k = 0; k < argc; k++) {
		const char *arg = argv[k];
		const char *eq = strchr(arg, '=');
		if (!eq) {
			fprintf(stderr, "ptscope: bad plugin argument %s\n", arg);
			return -1;
		}
		size_t key = (size_t)(eq - arg);
		const char *value = eq + 1;
		uint64_t v = 0;
#define KEY(name) (key == sizeof(name) - 1 && strncmp(arg, name, key) == 0)
		if (KEY("dir")) {
			snprintf(cfg.dir, sizeof cfg.dir, "%s", value);
		} else if (KEY("rawlog")) {
			snprintf(cfg.rawlog, sizeof cfg.rawlog, "%s", value);
		} else if (KEY("probe")) {
			return 0; /* ptscope asks whether this QEMU accepts the plugin */
		} else if (KEY("comm")) {
			snprintf(cfg.comm, sizeof cfg.comm, "%s", value);
		} else if (parse_u64(value, &v) != 0) {
			fprintf(stderr, "ptscope: bad plugin argument %s\n", arg);
			return -1;
		} else if (KEY("argc")) {
			cfg.argc = (uint32_t)v;
		} else if (KEY("watch")) {
			cfg.watch_pid = (pid_t)v;
		} else if (KEY("watch_start")) {
			cfg.watch_start = v;
		} else if (KEY("psb")) {
			cfg.psb_period = v;
		} else if (KEY("limit")) {
			cfg.limit = v;
		} else if (KEY("chunk")) {
			cfg.chunk = v < 4096 ? 4096 : (v + 7) & ~7ULL;
		} else if (KEY("cpi")) {
			cfg.cpi = v;
		} else if (KEY("syscall")) {
			cfg.syscall_cycles = v;
		} else if (KEY("start_tsc")) {
			cfg.start_tsc = v;
		} else if (KEY("shift")) {
			cfg.time_shift = v;
		} else if (KEY("mult")) {
			cfg.time_mult = v;
		} else if (KEY("ratio")) {
			cfg.ratio = v;
		} else if (KEY("cycthr")) {
			cfg.cyc_threshold = v ? v : 1;
		} else {
			fprintf(stderr, "ptscope: unknown plugin argument %s\n", arg);
			return -1;
		}
#undef KEY
	}
	if (!cfg.dir[0]) {
		fprintf(stderr, "ptscope: the recorder needs dir=DIRECTORY\n");
		return -1;
	}
	char error[512];
	struct perf_file_info pi = {
	    .time_shift = cfg.time_shift,
	    .time_mult = cfg.time_mult,
	    .ratio = cfg.ratio,
	    .cmdline = guest_cmdline(),
	};
	if (pf_create(cfg.dir, &pi, cfg.limit, error, sizeof error) != 0) {
		fprintf(stderr, "ptscope: %s\n", error);
		return -1;
	}
	snprintf(jit_path, sizeof jit_path, "%s/jitted-code.bin", cfg.dir);
	proc.pid = first_pid = (uint32_t)getpid();
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
	qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
	qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_ret);
	qemu_plugin_register_vcpu_exit_cb(id, on_vcpu_exit);
	qemu_plugin_register_atexit_cb(id, on_exit_, NULL);
	start_watcher();
	return 0;
}
